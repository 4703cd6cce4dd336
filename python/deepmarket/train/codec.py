"""Compression of the vectors workers exchange (pseudo-gradients and updates).

A vector is one flat float32 array (every weight of a model, concatenated).
`encode` turns it into a small header (a dict that goes into the frame's
JSON header) and a payload; `decode` turns both back into float32. Decoding
is deterministic: every worker that decodes the same bytes gets the same
array, bit for bit, which is what keeps the workers' weights identical.

Codecs:
  none  float32 as is (4 bytes an element).
  fp16  IEEE half precision (2 bytes an element); values beyond +-65504 are
        clipped. Relative error <= 2**-11 for normal numbers.
  int8  blockwise absmax quantisation: blocks of BLOCK elements, each with a
        float32 scale max|x|/127 and int8 codes round(x/scale)
        (1 + 4/BLOCK bytes an element). Absolute error <= max|x in block|/254.
"""

import numpy as np

CODECS = ("none", "fp16", "int8")
BLOCK = 256
FP16_MAX = 65504.0


def normalize(name):
    """Returns the canonical codec name for name (None means "none")."""
    if name is None:
        return "none"
    name = str(name).lower()
    if name in ("", "none", "fp32", "float32"):
        return "none"
    if name in ("fp16", "float16", "half"):
        return "fp16"
    if name in ("int8", "q8", "8bit"):
        return "int8"
    raise ValueError("unknown compression %r: want one of int8, fp16, none" % name)


def encode(vec, codec):
    """Encodes a flat float32 vector; returns (meta, payload bytes)."""
    codec = normalize(codec)
    x = np.ascontiguousarray(vec, dtype=np.float32).ravel()
    if not np.all(np.isfinite(x)):
        raise ValueError("cannot send a vector with NaN or infinite values")
    n = x.size
    if codec == "none":
        return {"codec": "none", "n": n}, x.astype("<f4", copy=False).tobytes()
    if codec == "fp16":
        return {"codec": "fp16", "n": n}, np.clip(x, -FP16_MAX, FP16_MAX).astype("<f2").tobytes()
    nb = -(-n // BLOCK)
    padded = np.zeros(nb * BLOCK, dtype=np.float32)
    padded[:n] = x
    blocks = padded.reshape(nb, BLOCK)
    scale = (np.abs(blocks).max(axis=1) / np.float32(127.0)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    q = np.rint(blocks / safe[:, None]).clip(-127, 127).astype(np.int8).ravel()[:n]
    return {"codec": "int8", "n": n, "block": BLOCK}, scale.astype("<f4").tobytes() + q.tobytes()


def decode(meta, payload):
    """Decodes what encode produced into a new float32 vector."""
    codec, n = meta.get("codec"), meta.get("n")
    if not isinstance(n, int) or n < 0:
        raise ValueError("bad element count %r" % (n,))
    if codec == "none":
        _expect(payload, 4 * n, codec)
        return np.frombuffer(payload, dtype="<f4").astype(np.float32)
    if codec == "fp16":
        _expect(payload, 2 * n, codec)
        return np.frombuffer(payload, dtype="<f2").astype(np.float32)
    if codec == "int8":
        block = meta.get("block")
        if not isinstance(block, int) or block < 1:
            raise ValueError("bad int8 block size %r" % (block,))
        nb = -(-n // block)
        _expect(payload, 4 * nb + n, codec)
        scale = np.frombuffer(payload, dtype="<f4", count=nb).astype(np.float32)
        q = np.zeros(nb * block, dtype=np.float32)
        q[:n] = np.frombuffer(payload, dtype=np.int8, offset=4 * nb)
        return (q.reshape(nb, block) * scale[:, None]).ravel()[:n]
    raise ValueError("unknown codec %r" % (codec,))


def _expect(payload, size, codec):
    if len(payload) != size:
        raise ValueError("%s payload of %d bytes, expected %d" % (codec, len(payload), size))
