"""Held DiLoCo with real TensorFlow: the example's train.py as the holder
and three workers, processes on loopback, one of them hostile
(hostile_worker.py). The holder must refuse every update of the hostile
worker, account it no accepted round, and end with a model about as good
as the honest workers make it; with its checks off the same worker must
do harm (or be paid), or the test proves nothing. Fashion-MNIST comes
from the Debian package dataset-fashion-mnist.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "fashion-mnist", "train.py")
HOSTILE = os.path.join(HERE, "hostile_worker.py")
DATA = "/usr/share/datasets/fashion-mnist"
WAIT = 600

sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from test_averager import free_addrs  # noqa: E402


def held_job(hostile=None, checks=True, workers=3, epochs=3, extra=()):
    """Runs a held job; the last worker is hostile (DM_HOSTILE) when asked.
    Returns the holder's result.json and every process's output."""
    addrs = free_addrs(workers + 1)
    args = ["--mode", "diloco", "--data", DATA, "--epochs", str(epochs), "--steps-per-epoch", "60",
            "--sync-every", "20", "--compress", "int8", "--join-timeout", "20", "--round-timeout", "10", "--no-overlap"] + list(extra)
    with tempfile.TemporaryDirectory() as d:
        procs = []
        for rank in range(workers + 1):
            env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", DM_CORES="1",
                       PYTHONPATH=os.path.join(HERE, ".."), DM_AVG_PEERS=",".join(addrs[:workers]), DM_AVG_HOLDER=addrs[workers], DM_JOB_ID="held-test")
            env.pop("TF_CONFIG", None)
            argv = [sys.executable, TRAIN] + args + ["--out", os.path.join(d, "out%d" % rank)]
            if rank == workers:
                env["DM_ROLE"] = "holder"
                if not checks:
                    argv.append("--no-checks")
            else:
                env["DM_RANK"] = str(rank)
                env["DM_PROGRESS_FILE"] = os.path.join(d, "progress%d.json" % rank)
                if hostile and rank == workers - 1:
                    env["DM_HOSTILE"] = hostile
                    argv = [sys.executable, HOSTILE] + argv[1:]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        outs = [None] * len(procs)
        try:
            outs[-1] = procs[-1].communicate(timeout=WAIT)[0]
            for i, p in enumerate(procs[:-1]):
                try:
                    outs[i] = p.communicate(timeout=5 if hostile and i == workers - 1 else 90)[0]
                except subprocess.TimeoutExpired:  # the lazy one, or one left waiting
                    p.kill()
                    outs[i] = p.communicate()[0]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        path = os.path.join(d, "out%d" % workers, "result.json")
        if procs[-1].returncode != 0 or not os.path.exists(path):
            raise AssertionError("the holder failed (%s):\n%s" % (procs[-1].returncode, outs[-1]))
        with open(path) as f:
            result = json.load(f)
        # What each worker's node would read of its round answers.
        result["_progress"] = {}
        for rank in range(workers):
            try:
                with open(os.path.join(d, "progress%d.json" % rank)) as f:
                    result["_progress"][str(rank)] = json.load(f)
            except FileNotFoundError:
                pass
        return result, outs, [p.returncode for p in procs]


class HeldTrainingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.isdir(DATA):
            raise AssertionError("no Fashion-MNIST in %s: apt-get install dataset-fashion-mnist" % DATA)
        cls.honest, cls.honest_out, _ = held_job(workers=2)

    def test_honest_workers_are_all_accepted(self):
        r = self.honest
        self.assertGreater(r["test_accuracy"], 0.75, self.honest_out[-1])
        for rank in ("0", "1"):
            self.assertGreaterEqual(r["accounts"][rank]["accepted"], r["rounds"] - 1, r["accounts"])
            self.assertEqual(r["accounts"][rank]["refused"], 0, r["accounts"])
            # Its node saw the answers too.
            got = r["_progress"][rank]
            self.assertGreaterEqual(got["accepted"], r["rounds"] - 1, got)
            self.assertEqual((got["refused"], got["refused_run"]), (0, 0), got)

    def test_a_poisoning_worker_is_refused_and_earns_nothing(self):
        r, outs, _ = held_job("scaled")
        acc = r["accounts"]
        self.assertEqual(acc.get("2", {}).get("accepted", 0), 0, acc)
        self.assertTrue(acc["2"]["dropped"], acc)
        # Its node saw every answer refuse it, in a row: the lender's
        # stop-loss reads refused_run.
        got = r["_progress"]["2"]
        self.assertEqual(got["accepted"], 0, got)
        self.assertGreaterEqual(got["refused_run"], 1, got)
        self.assertEqual(got["refused_run"], got["refused"], got)
        self.assertGreater(r["test_accuracy"], self.honest["test_accuracy"] - 0.03, outs[-1])
        # Checks off: the same worker wrecks the model.
        r, outs, _ = held_job("scaled", checks=False)
        self.assertGreater(r["accounts"]["2"]["accepted"], 0, r["accounts"])
        self.assertLess(r["test_accuracy"], 0.5, outs[-1])

    def test_a_nan_worker_is_refused(self):
        r, outs, rcs = held_job("nan")
        self.assertEqual(r["accounts"]["2"]["accepted"], 0, r["accounts"])
        self.assertIn("not finite", r["accounts"]["2"]["last_refusal"])
        self.assertGreater(r["test_accuracy"], self.honest["test_accuracy"] - 0.03, outs[-1])

    def test_spot_checks_catch_a_shirker(self):
        # Its updates help (a third of the real one's size): the holder's
        # checks accept them, and only a replay of its round shows that
        # it did not take the steps it says.
        # One epoch (three rounds, each replayed) is enough to catch it.
        r, outs, _ = held_job("shirk", workers=2, epochs=1, extra=["--verify-rate", "1"])
        acc = r["accounts"]
        self.assertTrue(acc["1"]["forfeited"], acc)
        self.assertEqual(acc["1"]["seconds"], 0, acc)
        self.assertIn("does not replay", acc["1"]["check_failure"])
        self.assertGreaterEqual(acc["0"]["checks_passed"], 1, outs[-1])
        self.assertFalse(acc["0"]["forfeited"], acc)
        self.assertEqual(acc["0"]["held_seconds"], 0, acc)
        self.assertGreater(acc["0"]["seconds"], 0, acc)
        # Spot checks off: the shirker is paid.
        r, outs, _ = held_job("shirk", workers=2, epochs=1)
        self.assertGreater(r["accounts"]["1"]["accepted"], 0, r["accounts"])
        self.assertGreater(r["accounts"]["1"]["seconds"], 0, r["accounts"])

    def test_a_lazy_lender_earns_nothing(self):
        r, outs, _ = held_job("lazy")
        self.assertNotIn("2", r["accounts"])  # never joined: no round to pay
        self.assertGreater(r["test_accuracy"], self.honest["test_accuracy"] - 0.03, outs[-1])


if __name__ == "__main__":
    unittest.main()
