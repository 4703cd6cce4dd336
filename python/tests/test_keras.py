"""DiLoCo with real TensorFlow: Keras workers as processes on loopback, killed
with SIGKILL and restarted. Each test takes some 20-50 s on 2 busy cores,
most of it importing TensorFlow in every process.
"""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np

from test_averager import free_addrs

WORKER = os.path.join(HERE, "keras_worker.py")
WAIT = 600  # seconds a test waits for a line, an exit; generous: the machine may be busy


class Proc:
    """A worker process whose output lines arrive on a queue."""

    def __init__(self, rank, addrs, out, **flags):
        args = [sys.executable, WORKER, "--rank", str(rank), "--peers", ",".join(addrs), "--out", out]
        for k, v in flags.items():
            args += ["--" + k.replace("_", "-")] + ([str(v)] if v != "" else [])
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.rank, self.lines, self.all = rank, queue.Queue(), []
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.all.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, pattern, timeout=WAIT):
        """Returns the first next line matching pattern (a regex match)."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError("rank %d: no line like %r within %ds; output:\n%s"
                                     % (self.rank, pattern, timeout, "\n".join(self.all))) from None
            if line is None:
                raise AssertionError("rank %d exited (%s) before a line like %r; output:\n%s"
                                     % (self.rank, self.p.wait(), pattern, "\n".join(self.all)))
            m = re.search(pattern, line)
            if m:
                return m

    def finish(self, test):
        rc = self.p.wait(timeout=WAIT)
        self.reader.join(5)
        self.p.stdout.close()
        if os.environ.get("DM_TEST_VERBOSE"):
            print("\n--- rank %d\n%s" % (self.rank, "\n".join(self.all)))
        test.assertEqual(rc, 0, "rank %d failed:\n%s" % (self.rank, "\n".join(self.all)))
        return self

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        self.reader.join(5)
        self.p.stdout.close()

    def digests(self):
        """round -> digest, from this process's "round R digest D" lines."""
        return {int(m.group(1)): m.group(2) for m in
                (re.search(r"^(?:joined )?round (\d+) digest (\w+)", l) for l in self.all) if m}

    def final(self):
        m = re.search(r"final round (\d+) digest (\w+) accuracy ([\d.]+)", "\n".join(self.all))
        return int(m.group(1)), m.group(2), float(m.group(3))

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.reader.join(5)
        self.p.stdout.close()


class KerasDiLoCoTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.stop()

    def start(self, rank, addrs, **flags):
        p = Proc(rank, addrs, os.path.join(self.tmp.name, "w%d" % rank), **flags)
        self.procs.append(p)
        return p

    def stats(self, rank):
        with open(os.path.join(self.tmp.name, "w%d" % rank, "worker-%d.json" % rank)) as f:
            return json.load(f)

    def test_single_worker_is_plain_keras(self):
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tensorflow as tf
        import tf_keras as keras
        import deepmarket.train as dmt

        tf.config.experimental.enable_op_determinism()
        rng = np.random.default_rng(0)
        x = rng.standard_normal((512, 8)).astype(np.float32)
        y = (x.sum(axis=1) > 0).astype(np.int64)

        def train(callbacks):
            keras.utils.set_random_seed(3)
            m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
            m.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            m.fit(x, y, batch_size=32, epochs=2, shuffle=False, callbacks=callbacks, verbose=0)
            return m.get_weights()

        cb = dmt.DiLoCo(sync_every=5, rank=0, peers=["127.0.0.1:0"], checkpoint_dir=self.tmp.name, log=lambda m: None)
        with_cb, plain = train([cb]), train([])
        for a, b in zip(with_cb, plain):
            np.testing.assert_array_equal(a, b)
        self.assertEqual(cb.round, 7)  # 32 steps: 6 full rounds and the last partial one
        self.assertEqual(cb.stats["bytes_sent"], 0)
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "diloco-state.npz")))  # done: removed
        self.assertTrue(os.path.isfile(os.path.join(self.tmp.name, "worker-0.json")))

    def test_holder_process_refuses_to_train(self):
        # A held job's program run as the holder (DM_ROLE=holder, the
        # default for diloco when the submitting node can hold) that builds
        # the worker's callback gets a clear error, not a silent worker.
        import deepmarket.train as dmt

        env = {"DM_ROLE": "holder", "DM_AVG_HOLDER": "127.0.0.1:1", "DM_AVG_HOLDER_RANKS": "127.0.0.1:1",
               "DM_RANK": "1", "DM_WORLD_SIZE": "1", "DM_AVG_PEERS": "127.0.0.1:2"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with self.assertRaisesRegex(ValueError, "KerasHolder"):
                dmt.DiLoCo(sync_every=5, log=lambda m: None)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_two_workers_converge_to_identical_weights(self):
        self.converge(rounds=8, sync_every=10, compress="int8")

    def test_overlapped_rounds_converge_to_identical_weights(self):
        self.converge(rounds=8, sync_every=10, compress="fp16", overlap="")

    def converge(self, **flags):
        # Nobody is killed here: the coordinator waits as long as it would in
        # a real job (60 s, not the 10 s that lets the kill tests go on alone),
        # so a busy machine cannot close a round without rank 1.
        flags.setdefault("timeout", 60)
        addrs = free_addrs(2)
        ps = [self.start(r, addrs, **flags) for r in range(2)]
        for p in ps:
            p.finish(self)
        out = "\n".join("--- rank %d\n%s" % (p.rank, "\n".join(p.all)) for p in ps)
        (r0, d0, acc0), (r1, d1, acc1) = ps[0].final(), ps[1].final()
        self.assertEqual((r0, r1), (8, 8), out)
        self.assertEqual(d0, d1, out)  # the same weights, bit for bit
        self.assertGreater(acc0, 0.85, out)  # 4 classes: chance is 0.25
        w0 = np.load(os.path.join(self.tmp.name, "w0", "final.npz"))
        w1 = np.load(os.path.join(self.tmp.name, "w1", "final.npz"))
        for k in w0.files:
            np.testing.assert_array_equal(w0[k], w1[k])
        s1 = self.stats(1)
        self.assertGreater(s1["bytes_sent"], 0, out)
        # Rank 1 is in every round from the one it started training at: round
        # 0 unless TensorFlow took it longer to import than rank 0 waits for
        # the first round (join_timeout), then a later one, with the job's
        # weights. That is the round its script says it began at: on a busy
        # machine it may join round 0 as rank 0's wait ends, and rank 0 then
        # closes round 1 without it before it trains (its averager's stats
        # say joined round 0). With rounds overlapped, a joiner whose first
        # update reached the coordinator after that round closed without it
        # is in every round from the next one.
        began = int(re.search(r"^joined round (\d+) ", "\n".join(ps[1].all), re.M).group(1))
        self.assertGreaterEqual(began, s1["joined_round"], out)
        missed = 1 if "overlap" in flags else 0
        self.assertIn(s1["rounds"], range(8 - began - missed, 8 - began + 1), out)
        self.assertEqual(s1["late"], 0, out)

    def test_killed_worker_rejoins_with_current_weights(self):
        addrs = free_addrs(2)
        flags = dict(rounds=40, sync_every=10, step_sleep=0.05)
        w0, w1 = self.start(0, addrs, **flags), self.start(1, addrs, **flags)
        w1.wait_for(r"^round 3 ")
        w1.kill()
        killed_at = int(w0.wait_for(r"^round (\d+) ").group(1))
        w0.wait_for(r"^round %d " % (killed_at + 2))  # rank 0 goes on alone
        w1b = self.start(1, addrs, **flags)  # the replacement: same rank, fresh process
        m = w1b.wait_for(r"^joined round (\d+) digest (\w+)")
        joined_round, joined_digest = int(m.group(1)), m.group(2)
        w0.finish(self)
        w1b.finish(self)
        self.assertGreater(joined_round, killed_at)
        self.assertEqual(joined_digest, w0.digests()[joined_round])  # the job's weights at that round
        self.assertEqual(w0.final()[:2], w1b.final()[:2])
        self.assertEqual(self.stats(1)["joined_how"], "joined")

    def test_coordinator_killed_next_takes_over(self):
        addrs = free_addrs(2)
        flags = dict(rounds=40, sync_every=10, step_sleep=0.05)
        w0, w1 = self.start(0, addrs, **flags), self.start(1, addrs, **flags)
        w0.wait_for(r"^round 3 ")
        w0.kill()
        w1.wait_for(r"rank 1 coordinates round (\d+)")
        took_over = int(w1.wait_for(r"^round (\d+) ").group(1))
        w0b = self.start(0, addrs, **flags)  # rank 0 comes back and takes its role back
        m = w0b.wait_for(r"^joined round (\d+) digest (\w+)")
        joined_round, joined_digest = int(m.group(1)), m.group(2)
        w1.finish(self)
        w0b.finish(self)
        self.assertGreaterEqual(joined_round, took_over)
        self.assertEqual(joined_digest, w1.digests()[joined_round])
        self.assertEqual(w0b.final()[:2], w1.final()[:2])
        self.assertEqual(w1.final()[0], 40)
        s0, s1 = self.stats(0), self.stats(1)
        self.assertGreater(s1["rounds_coordinated"], 0)
        self.assertGreater(s0["rounds_coordinated"], 0)


if __name__ == "__main__":
    unittest.main()
