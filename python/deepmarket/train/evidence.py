"""A refused round's evidence, as a worker keeps it for an appeal.

In a held job the holder (the payer's program) judges every update, and
the payer's node signs what it answered (a ledger answer): the round it
last refused this worker in, and the digests of what it refused: the
round's global weights theta, the weights before the last update that
moved them (for the echo check), the update as the holder decoded it, and
the model's description. A worker whose node gave it DM_EVIDENCE_DIR keeps
the same arrays for each round the holder refuses, so that referees can
recompute the checks from bytes whose digests the payer signed.

Each refused round gets a directory round-<r> (written whole, then
renamed into place) holding:

  theta.npy       the round's global weights (float32)
  prev_theta.npy  the weights before the last update that moved them (when
                  there was one)
  update.npy      this worker's update, as the holder decodes it (float32)
  model.json      the model's description (keras_callback writes it)
  evidence.json   {"round", "theta", "prev", "update", "model", "steps"}:
                  the digests (averager.digest; sha256 for model.json)

Only the newest KEEP rounds are kept: the payer's answer names the last
refusal, and it reaches the node with a receipt a little later.
"""

import hashlib
import json
import os
import shutil

import numpy as np

KEEP = 3


def digest(theta):
    """The digest of a flat float32 vector: averager.digest's, which the
    holder's answers name."""
    return hashlib.blake2b(np.ascontiguousarray(theta, dtype="<f4").tobytes(), digest_size=12).hexdigest()


def model_digest(desc):
    """The digest of a model description (bytes)."""
    return hashlib.sha256(desc).hexdigest()


def model_description(model):
    """A Keras model's description, as bytes the holder and every worker
    compute alike from the same program: its architecture (to_json) and its
    loss. A referee rebuilds the model from it, without the job's code."""
    from .keras_callback import _keras
    loss = model.loss
    if not isinstance(loss, str):
        loss = _keras.losses.serialize(loss)
    return json.dumps({"keras": json.loads(model.to_json()), "loss": loss}, sort_keys=True,
                      separators=(",", ":")).encode()


def save(root, r, theta, prev, update, steps, model=None):
    """Writes round r's evidence under root (see the module's doc); returns
    its directory. Older rounds beyond KEEP are removed."""
    final = os.path.join(root, "round-%d" % r)
    tmp = os.path.join(root, ".round-%d.tmp" % r)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    meta = {"round": int(r), "theta": digest(theta), "update": digest(update), "steps": int(steps), "prev": "",
            "model": ""}
    np.save(os.path.join(tmp, "theta.npy"), np.asarray(theta, dtype="<f4"), allow_pickle=False)
    np.save(os.path.join(tmp, "update.npy"), np.asarray(update, dtype="<f4"), allow_pickle=False)
    if prev is not None:
        np.save(os.path.join(tmp, "prev_theta.npy"), np.asarray(prev, dtype="<f4"), allow_pickle=False)
        meta["prev"] = digest(prev)
    if model is not None:
        with open(os.path.join(tmp, "model.json"), "wb") as f:
            f.write(model)
        meta["model"] = model_digest(model)
    with open(os.path.join(tmp, "evidence.json"), "w") as f:
        json.dump(meta, f, sort_keys=True)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    rounds = sorted((int(n[6:]) for n in os.listdir(root) if n.startswith("round-") and n[6:].isdigit()))
    for old in rounds[:-KEEP]:
        shutil.rmtree(os.path.join(root, "round-%d" % old), ignore_errors=True)
    return final


def load(d):
    """Reads an evidence directory: (meta, theta, prev or None, update,
    model description or None). Arrays are read without pickle."""
    with open(os.path.join(d, "evidence.json")) as f:
        meta = json.load(f)

    def arr(name):
        p = os.path.join(d, name)
        if not os.path.exists(p):
            return None
        a = np.load(p, allow_pickle=False)
        if a.dtype != np.dtype("<f4") or a.ndim != 1:
            raise ValueError("%s: want a flat float32 array, have %s %s" % (name, a.dtype, a.shape))
        return a

    model = None
    if os.path.exists(os.path.join(d, "model.json")):
        with open(os.path.join(d, "model.json"), "rb") as f:
            model = f.read()
    return meta, arr("theta.npy"), arr("prev_theta.npy"), arr("update.npy"), model
