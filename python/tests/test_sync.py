"""Synchronous training (MultiWorkerMirroredStrategy) across two worker
processes on loopback, one of them paused (SIGSTOP) for 20 s mid-job, as
the node's owner policy freezes a suspended job's workers and as an
overloaded machine stalls them. Each test takes some 30-50 s on 2 busy
cores.
"""

import os
import signal
import subprocess
import sys
import threading
import time
import unittest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_averager import free_addrs

WORKER = os.path.join(HERE, "sync_worker.py")
WAIT = 600  # seconds: the machine may be busy
PAUSE = 20  # seconds: twice TensorFlow's default heartbeat timeout


class SyncPauseTest(unittest.TestCase):
    def run_paused(self, heartbeat_timeout):
        """Starts two workers, pauses rank 1 for PAUSE seconds once rank 0
        has taken 20 steps, and returns each one's exit code and output."""
        addrs = free_addrs(2)
        procs = [subprocess.Popen([sys.executable, WORKER, "--rank", str(r), "--peers", ",".join(addrs),
                                   "--heartbeat-timeout", str(heartbeat_timeout)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        outs = [[], []]
        stepped = threading.Event()

        def read(r):
            for line in procs[r].stdout:
                outs[r].append(line)
                if r == 0 and line.startswith("step 20"):
                    stepped.set()

        readers = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(2)]
        for t in readers:
            t.start()
        try:
            self.assertTrue(stepped.wait(WAIT), "rank 0 never took 20 steps:\n%s" % "".join(outs[0]))
            procs[1].send_signal(signal.SIGSTOP)
            time.sleep(PAUSE)
            procs[1].send_signal(signal.SIGCONT)
            codes = [p.wait(timeout=WAIT) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for t, p in zip(readers, procs):
            t.join(5)
            p.stdout.close()
        return codes, ["".join(o) for o in outs]

    def test_a_paused_worker_resumes_the_job(self):
        codes, outs = self.run_paused(-1)  # deepmarket.train.sync_strategy's default
        for r in range(2):
            self.assertEqual(codes[r], 0, "rank %d failed after the pause:\n%s" % (r, outs[r][-3000:]))
            self.assertIn("step 120", outs[r])
            self.assertIn("done accuracy", outs[r])

    def test_tensorflow_defaults_fail_the_job(self):
        # The control: the same pause under TensorFlow's own 10 s heartbeat
        # timeout ends the job, as it ended jobs before sync_strategy.
        codes, outs = self.run_paused(0)
        self.assertNotEqual(codes, [0, 0], "both workers survived a %d s pause with TensorFlow's defaults" % PAUSE)
        self.assertIn("stopped sending heartbeats", outs[0] + outs[1])


if __name__ == "__main__":
    unittest.main()
