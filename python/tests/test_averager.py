"""The averaging protocol between real sockets on loopback, workers as threads.

No TensorFlow here: workers are numpy vectors that take fake inner steps, so
the outer step's arithmetic can be checked exactly. test_keras.py runs the
same protocol between real Keras processes and kills them.
"""

import os
import random
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

from deepmarket.train import Averager, Peers, digest, outer_step
from deepmarket.train.averager import CHECKPOINT

N = 3000


def free_addrs(n):
    """n free ports of 127.0.0.1, below the kernel's ephemeral range: no
    outgoing connection (a worker redialling a killed peer included) takes
    one of them as its source port while the test means to listen there."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    addrs = []
    while len(addrs) < n:
        port = rng.randrange(max(1024, low - 12000), low)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        addr = "127.0.0.1:%d" % port
        if addr not in addrs:
            addrs.append(addr)
    return tuple(addrs)


def delta_for(rank, rnd):
    """The pseudo-gradient worker `rank` produces in round `rnd` (deterministic)."""
    return np.random.default_rng(1000 * rank + rnd).standard_normal(N).astype(np.float32) * np.float32(0.01)


class Worker:
    """A thread that joins, runs rounds and records what it saw."""

    def __init__(self, rank, addrs, rounds, H=10, compress="none", timeout=10.0, ckpt=None, init=None,
                 round_time=0.5):
        self.rank, self.rounds, self.H, self.round_time = rank, rounds, H, round_time
        self.log = []
        self.av = Averager(Peers(rank, addrs, "test"), sync_every=H, compress=compress, timeout=timeout,
                           join_timeout=10, connect_timeout=2, checkpoint_dir=ckpt,
                           log=lambda m: self.log.append(m))
        self.init = np.full(N, float(rank + 1), np.float32) if init is None else init
        self.seen = []      # (round, digest) after each sync
        self.outcomes = []
        self.joined = None
        self.crash_after = None
        self.stop_at = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _run(self):
        try:
            res = self.av.start(self.init)
            self.joined = (res.round, digest(res.theta), res.outcome)
            while res.round < self.rounds and not res.stop:
                if self.crash_after is not None and res.round >= self.crash_after:
                    return self._crash()
                time.sleep(self.round_time * res.steps / self.H)  # the inner steps
                local = res.theta - delta_for(self.rank, res.round) if res.steps else None
                res = self.av.sync(local, res.steps, stop=res.round == self.stop_at)
                self.seen.append((res.round, digest(res.theta)))
                self.outcomes.append(res.outcome)
            self.final = res
            self.av.close()
        except Exception as e:  # reported by the test
            self.error = e
            raise

    def _crash(self):
        """Vanishes without a goodbye, like a killed process: every socket closes."""
        self.av._closing = True
        self.av._drop_link()
        self.av._stop_server()

    def join(self, test):
        self.thread.join(60)
        test.assertFalse(self.thread.is_alive(), "rank %d did not finish" % self.rank)
        test.assertIsNone(self.error)


class AveragerTest(unittest.TestCase):
    def test_single_worker_changes_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            av = Averager(Peers(0, ("127.0.0.1:0",), "test"), sync_every=5, checkpoint_dir=d)
            res = av.start(np.zeros(N, np.float32))
            self.assertEqual((res.round, res.steps), (0, 5))
            local = delta_for(0, 0)
            res = av.sync(local, 5)
            np.testing.assert_array_equal(res.theta, local)  # no outer step, no averaging
            self.assertEqual(res.round, 1)
            av.close()
            self.assertTrue(os.path.isfile(os.path.join(d, CHECKPOINT)))

    def test_outer_step_on_the_average(self):
        addrs = free_addrs(3)
        ws = [Worker(r, addrs, rounds=2, round_time=1.5) for r in range(3)]
        for w in ws[::-1]:  # the others wait for rank 0 to found the job
            w.start()
        for w in ws:
            w.join(self)
        # Everyone adopted rank 0's initial weights, whatever its own were.
        self.assertEqual({w.joined[1] for w in ws}, {digest(np.full(N, 1.0, np.float32))})
        # Round by round, the same state everywhere, and it is the DiLoCo outer step.
        theta, mom = np.full(N, 1.0, np.float32), np.zeros(N, np.float32)
        for rnd in range(2):
            # What each worker hands in: theta - local, local = theta - its step.
            avg = sum(theta - (theta - delta_for(r, rnd)) for r in range(3)) / np.float32(3)
            theta, mom = outer_step(theta, mom, avg.astype(np.float32), 0.7, 0.9)
            want = digest(theta)
            for w in ws:
                self.assertIn((rnd + 1, want), w.seen, "rank %d round %d" % (w.rank, rnd + 1))
        self.assertTrue(all(w.final.round == 2 for w in ws))

    def test_int8_rounds_keep_copies_identical(self):
        addrs = free_addrs(2)
        ws = [Worker(r, addrs, rounds=6, compress="int8").start() for r in range(2)]
        for w in ws:
            w.join(self)
        self.assertEqual(ws[0].seen[-3:], ws[1].seen[-3:])
        up = ws[1].av.stats["bytes_sent"] / ws[1].av.stats["rounds"]
        self.assertLess(up, N * 1.1 + 400)  # int8: about one byte a weight, plus the header

    def test_coordinator_lost_next_rank_takes_over(self):
        addrs = free_addrs(3)
        ws = [Worker(r, addrs, rounds=6) for r in range(3)]
        ws[0].crash_after = 2
        for w in ws:
            w.start()
        for w in ws[1:]:
            w.join(self)
        ws[0].thread.join(10)
        self.assertEqual(ws[1].final.round, 6)
        self.assertEqual(ws[1].seen[-4:], ws[2].seen[-4:])
        self.assertGreater(ws[1].av.stats["rounds_coordinated"], 0)
        self.assertEqual(ws[2].av.stats["rounds_coordinated"], 0)

    def test_member_lost_and_replaced(self):
        addrs = free_addrs(2)
        w0 = Worker(0, addrs, rounds=8)
        w1 = Worker(1, addrs, rounds=8)
        w1.crash_after = 2
        w0.start()
        w1.start()
        w1.thread.join(30)
        self.assertFalse(w1.thread.is_alive())
        w1b = Worker(1, addrs, rounds=8, init=np.full(N, 42.0, np.float32)).start()  # same rank, restarted
        w0.join(self)
        w1b.join(self)
        self.assertEqual(w1b.joined[2], "joined")
        self.assertIn(w1b.joined[:2], [(0, digest(np.full(N, 1.0, np.float32)))] + w0.seen)
        self.assertEqual(w0.seen[-1], w1b.seen[-1])

    def test_stop_keeps_the_weights_it_was_asked_at(self):
        addrs = free_addrs(2)
        ws = [Worker(r, addrs, rounds=10) for r in range(2)]
        ws[1].stop_at = 3  # say rank 1 saw the target accuracy at round 3
        for w in ws:
            w.start()
        for w in ws:
            w.join(self)
        at_request = dict(ws[1].seen)[3]
        for w in ws:
            self.assertTrue(w.final.stop)
            self.assertEqual(w.seen[-1], (4, at_request))  # one more round, the same weights

    def test_a_non_finite_delta_is_never_averaged(self):
        # A hostile worker sends NaN past the codec (which refuses to
        # encode it): the coordinator refuses it, and the rounds go on.
        addrs = free_addrs(2)
        ws = [Worker(r, addrs, rounds=4) for r in range(2)]
        bad = ws[1].av

        def nan_push(c, delta, steps, stop):
            payload = np.full(N, np.nan, dtype="<f4").tobytes()
            return bad._request(c, {"t": "push", "steps": steps, "stop": False, "codec": "none", "n": N}, payload, reuse=True)

        bad._push = nan_push
        for w in ws:
            w.start()
        for w in ws:
            w.join(self)
        self.assertEqual(ws[0].seen[-1], ws[1].seen[-1])
        self.assertTrue(np.isfinite(ws[0].final.theta).all())
        self.assertEqual(bad.stats["refused"], 4)

    def test_checkpoint_resume(self):
        addrs = free_addrs(2)
        with tempfile.TemporaryDirectory() as d:
            ws = [Worker(r, addrs, rounds=3, ckpt=os.path.join(d, str(r))).start() for r in range(2)]
            for w in ws:
                w.join(self)
            # A re-placed job: rank 0 starts from its checkpoint, rank 1 from it.
            ws2 = [Worker(r, addrs, rounds=5, ckpt=os.path.join(d, str(r))).start() for r in range(2)]
            for w in ws2:
                w.join(self)
        self.assertEqual(ws2[0].joined[:2], (3, ws[0].seen[-1][1]))
        self.assertEqual(ws2[0].joined[2], "resumed")
        self.assertEqual(ws2[1].joined[:2], ws2[0].joined[:2])
        self.assertEqual(ws2[0].seen[-1], ws2[1].seen[-1])
        self.assertEqual(ws2[0].final.round, 5)


if __name__ == "__main__":
    unittest.main()
