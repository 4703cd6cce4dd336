"""The referee's recomputation (deepmarket.train.referee) on a real Keras
model: a refused update that helps the validation loss is overturned; one
that harms it, repeats the last update, is not finite, or comes with
arrays other than those the payer's answer names, stands; a model the
referee would have to run the job's code for is not judged at all. The
program is run as the referee's node runs it (python -m, case.json).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

from deepmarket.train import evidence
from deepmarket.train.keras_callback import _flatten, _keras
from deepmarket.train.referee import CannotJudge, judge

CHECKS = {"tolerance": 0.1, "echo": 0.98, "residual": 0.9, "norm_factor": 10.0}


def model(lam=False):
    layers = [_keras.layers.Input((8,)), _keras.layers.Dense(16, activation="relu")]
    if lam:
        layers.append(_keras.layers.Lambda(lambda t: t * 2))
    layers.append(_keras.layers.Dense(3))
    m = _keras.Sequential(layers)
    m.compile(optimizer=_keras.optimizers.SGD(0.1),
              loss=_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)
    return x, y


class RefereeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        _keras.utils.set_random_seed(1)
        cls.d = tempfile.mkdtemp()
        m = model()
        cls.desc = evidence.model_description(m)
        cls.prev = _flatten(m.get_weights())
        x, y = data(600, 0)
        m.fit(x[:300], y[:300], epochs=1, batch_size=32, verbose=0)
        cls.theta = _flatten(m.get_weights())  # the round's weights, after one update
        m.fit(x[300:], y[300:], epochs=2, batch_size=32, verbose=0)
        cls.good = cls.theta - _flatten(m.get_weights())  # a worker's honest round
        xv, yv = data(300, 7)
        cls.validation = os.path.join(cls.d, "validation.npz")
        np.savez(cls.validation, x=xv, y=yv)

    def case(self, update, prev=None, theta=None, name="c", model=True):
        theta = self.theta if theta is None else theta
        prev = self.prev if prev is None else prev
        ev = evidence.save(os.path.join(self.d, name), 4, theta, prev, update, 20, self.desc)
        c = dict(CHECKS, theta=evidence.digest(theta), prev=evidence.digest(prev), update=evidence.digest(update),
                 model=evidence.model_digest(self.desc) if model else "")
        return c, ev

    def test_a_helpful_update_is_overturned(self):
        c, ev = self.case(self.good)
        v = judge(c, ev, self.validation)
        self.assertTrue(v["overturn"], v)
        self.assertLess(v["loss_update"], v["loss_theta"], v)

    def test_harm_stands(self):
        for name, bad in (("scaled", -40 * self.good), ("nan", np.where(np.arange(self.good.size) == 3, np.nan, self.good)),
                          ("empty", np.zeros_like(self.good)), ("echo", self.prev - self.theta)):
            with self.subTest(name):
                c, ev = self.case(bad.astype(np.float32), name=name)
                v = judge(c, ev, self.validation)
                self.assertFalse(v["overturn"], v)

    def test_evidence_must_be_what_the_answer_names(self):
        # The appellant brings a better update than the one refused.
        c, ev = self.case(-40 * self.good, name="swap")
        np.save(os.path.join(ev, "update.npy"), self.good, allow_pickle=False)
        v = judge(c, ev, self.validation)
        self.assertFalse(v["overturn"], v)
        self.assertIn("not the one the payer's answer names", v["why"])
        # Or another theta, from which its update would look good.
        c, ev = self.case(self.good, name="theta")
        c["theta"] = evidence.digest(self.prev)
        self.assertFalse(judge(c, ev, self.validation)["overturn"])

    def test_what_it_cannot_recompute_it_does_not_judge(self):
        c, ev = self.case(self.good, name="nomodel", model=False)
        with self.assertRaisesRegex(CannotJudge, "no model description"):
            judge(c, ev, self.validation)
        lam = evidence.model_description(model(lam=True))
        ev = evidence.save(os.path.join(self.d, "lambda"), 4, self.theta, self.prev, self.good, 20, lam)
        c = dict(CHECKS, theta=evidence.digest(self.theta), prev=evidence.digest(self.prev),
                 update=evidence.digest(self.good), model=evidence.model_digest(lam))
        with self.assertRaisesRegex(CannotJudge, "Lambda"):
            judge(c, ev, self.validation)

    def test_the_program_as_the_node_runs_it(self):
        c, ev = self.case(self.good, name="cli")
        path = os.path.join(self.d, "case.json")
        with open(path, "w") as f:
            json.dump(c, f)
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."))
        out = subprocess.run([sys.executable, "-m", "deepmarket.train.referee", "--case", path, "--evidence", ev,
                              "--validation", self.validation], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(json.loads(out.stdout.strip().splitlines()[-1])["overturn"], out.stdout)
        c["model"] = ""
        with open(path, "w") as f:
            json.dump(c, f)
        out = subprocess.run([sys.executable, "-m", "deepmarket.train.referee", "--case", path, "--evidence", ev,
                              "--validation", self.validation], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
        self.assertTrue(json.loads(out.stdout.strip().splitlines()[-1])["abstain"])


if __name__ == "__main__":
    unittest.main()
