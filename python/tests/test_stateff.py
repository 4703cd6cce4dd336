"""The statistical-efficiency harness: its defaults are train.py's, the
scheduler's table is built from them seed by seed, and a run is the same
every time."""

import json
import os
import tempfile
import unittest
from unittest import mock

from deepmarket import stateff


class TestDefaultsAreTrainPys(unittest.TestCase):
    def test_same_as_train_py(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DM_")}
        with mock.patch.dict(os.environ, env, clear=True):
            a = stateff.load_train_py().parse_args([])
        d = stateff.DEFAULTS
        self.assertEqual((a.learning_rate, a.lr_scale, a.warmup_steps, a.sync_every, a.outer_lr, a.outer_momentum,
                          a.compress),
                         (d["learning_rate"], d["lr_scale"], d["warmup_steps"], d["sync_every"], d["outer_lr"],
                          d["outer_momentum"], d["compress"]))


def row(mode, k, seed, steps, **kw):
    d = stateff.DEFAULTS
    r = dict(mode=mode, workers=k, seed=seed, target=0.9, model="cnn-wide", batch_per_worker=64,
             steps_to={"0.90": steps}, steps_to_target=steps, reached=steps is not None)
    if mode == "sync":
        r.update(lr=d["learning_rate"], scale=d["lr_scale"] if k > 1 else "none", warmup=d["warmup_steps"] if k > 1 else 0)
    else:
        r.update(sync_every=d["sync_every"], outer_lr=d["outer_lr"], outer_momentum=d["outer_momentum"],
                 inner_lr=d["learning_rate"], compress=d["compress"])
    r.update(kw)
    return r


class TestTable(unittest.TestCase):
    def test_each_seed_against_its_own_single_worker(self):
        rows = [row("sync", 1, 1, 1000), row("sync", 1, 2, 2000),
                row("sync", 2, 1, 600), row("sync", 2, 2, 1400),
                row("sync", 2, 1, 100, lr=0.1),  # not the defaults: left out
                row("diloco", 2, 1, 2000),  # no gain: clamped to 1
                row("diloco", 4, 1, 100)]  # better than perfect: clamped to 1/4
        t = stateff.go_table(rows, 0.9, "cnn-wide")
        self.assertEqual(t["seeds"], [1, 2])
        sync = {p["workers"]: p for p in t["modes"]["sync"]}
        self.assertAlmostEqual(sync[2]["ratio"], (0.6 + 0.7) / 2)
        self.assertEqual(sync[2]["seeds"], 2)
        dil = {p["workers"]: p["ratio"] for p in t["modes"]["diloco"]}
        self.assertEqual((dil[1], dil[2], dil[4]), (1.0, 1.0, 0.25))

    def test_not_reached_is_no_gain_and_other_settings_make_their_own_table(self):
        rows = [row("sync", 1, 1, 1000),
                row("diloco", 2, 1, None, steps_run=3000),  # not reached in 3x one worker's steps
                row("diloco", 3, 1, None, steps_run=500),  # stopped too soon to say: left out
                row("diloco", 2, 1, 600, outer_lr=1.0, outer_momentum=0.0)]
        dil = {p["workers"]: p["ratio"] for p in stateff.go_table(rows, 0.9, "cnn-wide")["modes"]["diloco"]}
        self.assertEqual(dil, {1: 1.0, 2: 1.0})
        avg = dict(stateff.DEFAULTS, outer_lr=1.0, outer_momentum=0.0)
        t = stateff.go_table(rows, 0.9, "cnn-wide", avg)
        self.assertEqual({p["workers"]: p["ratio"] for p in t["modes"]["diloco"]}, {1: 1.0, 2: 0.6})
        self.assertEqual(t["defaults"]["outer_lr"], 1.0)

    def test_no_single_worker_no_table(self):
        with self.assertRaises(SystemExit):
            stateff.go_table([row("sync", 2, 1, 600)], 0.9, "cnn-wide")


class TestDeterministic(unittest.TestCase):
    def test_two_runs_give_the_same_curve(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows.json")
            args = ["--workers", "1,2", "--max-steps", "20", "--eval-every", "10", "--sync-every", "10",
                    "--target", "0.99", "--out", out]
            curves = []
            for _ in range(2):
                self.assertEqual(stateff.main(args), 0)
                with open(out) as f:
                    rows = json.load(f)["rows"]
                curves.append(sorted((r["mode"], r["workers"], json.dumps(r["curve"])) for r in rows))
                os.remove(out)
            self.assertEqual(len(curves[0]), 3)  # sync 1, sync 2, diloco 2
            self.assertEqual(curves[0], curves[1])


if __name__ == "__main__":
    unittest.main()
