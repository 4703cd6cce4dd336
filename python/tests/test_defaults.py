"""The callback's defaults come from the environment a node gives a job
(its spec's [training] block), and explicit arguments win."""

import os
import unittest
from unittest import mock


class TestDefaultsFromTheJobSpec(unittest.TestCase):
    def make(self, env, **kw):
        from deepmarket.train.keras_callback import DiLoCo
        with mock.patch.dict(os.environ, env, clear=False):
            return DiLoCo(rank=0, peers=["127.0.0.1:1"], **kw)

    def test_spec_sets_the_defaults(self):
        d = self.make({"DM_SYNC_EVERY": "7", "DM_COMPRESS": "fp16"})
        self.assertEqual((d.sync_every, d._opts["compress"]), (7, "fp16"))
        d = self.make({"DM_SYNC_EVERY": "7", "DM_COMPRESS": "none"})
        self.assertIsNone(d._opts["compress"])

    def test_without_a_spec(self):
        env = {k: v for k, v in os.environ.items() if k not in ("DM_SYNC_EVERY", "DM_COMPRESS")}
        with mock.patch.dict(os.environ, env, clear=True):
            from deepmarket.train.keras_callback import DiLoCo
            d = DiLoCo(rank=0, peers=["127.0.0.1:1"])
        self.assertEqual((d.sync_every, d._opts["compress"]), (500, "int8"))

    def test_arguments_win(self):
        d = self.make({"DM_SYNC_EVERY": "7", "DM_COMPRESS": "fp16"}, sync_every=20, compress=None)
        self.assertEqual((d.sync_every, d._opts["compress"]), (20, None))


if __name__ == "__main__":
    unittest.main()
