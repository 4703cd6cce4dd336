"""Compression round trips: error bounds, sizes, determinism."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

from deepmarket.train import codec


def sample(n, seed=0):
    rng = np.random.default_rng(seed)
    # Mixed scales, like a model's pseudo-gradient: most small, some large.
    x = rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    x[rng.integers(0, n, n // 100 + 1)] *= 300
    return x


class CodecTest(unittest.TestCase):
    def test_none_is_exact(self):
        x = sample(10_000)
        meta, payload = codec.encode(x, None)
        self.assertEqual(len(payload), 4 * x.size)
        np.testing.assert_array_equal(codec.decode(meta, payload), x)

    def test_fp16_relative_error(self):
        x = sample(10_000)
        meta, payload = codec.encode(x, "fp16")
        self.assertEqual(len(payload), 2 * x.size)
        y = codec.decode(meta, payload)
        # Half precision: 11 significant bits; below 2**-14 the spacing is 2**-24.
        self.assertTrue(np.all(np.abs(y - x) <= np.abs(x) * 2.0 ** -11 + 2.0 ** -25))

    def test_fp16_clips_out_of_range(self):
        meta, payload = codec.encode(np.array([1e6, -1e6, 1.0], np.float32), "fp16")
        np.testing.assert_array_equal(codec.decode(meta, payload), [65504.0, -65504.0, 1.0])

    def test_int8_blockwise_error_bound(self):
        for n in (1, 255, 256, 257, 100_003):
            x = sample(n, seed=n)
            meta, payload = codec.encode(x, "int8")
            nb = -(-n // codec.BLOCK)
            self.assertEqual(len(payload), n + 4 * nb)
            y = codec.decode(meta, payload)
            pad = np.zeros(nb * codec.BLOCK, np.float32)
            pad[:n] = np.abs(x)
            bound = np.repeat(pad.reshape(nb, -1).max(axis=1) / 254.0, codec.BLOCK)[:n]
            err = np.abs(y - x)
            self.assertTrue(np.all(err <= bound * (1 + 1e-5) + 1e-12), "n=%d max excess %g" % (n, (err - bound).max()))
            # And it is not just bounded but small on average (no bias).
            self.assertLess(abs(float(np.mean(y - x))), float(bound.mean()) / 10)

    def test_int8_zeros_and_empty(self):
        for x in (np.zeros(1000, np.float32), np.zeros(0, np.float32)):
            meta, payload = codec.encode(x, "int8")
            np.testing.assert_array_equal(codec.decode(meta, payload), x)

    def test_decode_is_deterministic(self):
        x = sample(5000)
        for c in codec.CODECS:
            meta, payload = codec.encode(x, c)
            a, b = codec.decode(meta, payload), codec.decode(dict(meta), bytes(payload))
            self.assertEqual(a.tobytes(), b.tobytes())

    def test_rejects_bad_input(self):
        with self.assertRaises(ValueError):
            codec.encode(np.array([np.nan], np.float32), "int8")
        meta, payload = codec.encode(sample(300), "int8")
        with self.assertRaises(ValueError):
            codec.decode(meta, payload[:-1])
        with self.assertRaises(ValueError):
            codec.normalize("int4")


if __name__ == "__main__":
    unittest.main()
