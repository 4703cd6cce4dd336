"""The local harness: the environment it gives workers, and its comparison."""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from deepmarket import bench_local
from deepmarket.train import env


class BenchLocalTest(unittest.TestCase):
    def test_plan_gives_each_worker_a_node_environment(self):
        specs = bench_local.plan("diloco", 3, ["--epochs", "1"], "/tmp/out", python="py", train_py="/x/train.py",
                                 tf_ports=[20000, 20001, 20002], avg_ports=[21000, 21001, 21002], pin=False)
        self.assertEqual([s.rank for s in specs], [0, 1, 2])
        for s in specs:
            self.assertEqual(s.argv, ["py", "/x/train.py", "--mode", "diloco", "--epochs", "1"])
            self.assertIsNone(s.cpu)
            tf = json.loads(s.env["TF_CONFIG"])
            self.assertEqual(tf["task"]["index"], s.rank)
            self.assertEqual(tf["cluster"]["worker"], ["127.0.0.1:20000", "127.0.0.1:20001", "127.0.0.1:20002"])
            # What the DiLoCo callback will read from it.
            peers = env.from_env(s.env)
            self.assertEqual(peers.rank, s.rank)
            self.assertEqual(peers.addrs, ("127.0.0.1:21000", "127.0.0.1:21001", "127.0.0.1:21002"))
        self.assertEqual(len({s.out for s in specs}), 3)

    def test_peers_fall_back_to_tf_config_ports(self):
        cfg = {"cluster": {"worker": ["127.0.0.1:20000", "127.0.0.1:20001"]}, "task": {"type": "worker", "index": 1}}
        peers = env.from_env({"TF_CONFIG": json.dumps(cfg)})
        self.assertEqual((peers.rank, peers.addrs), (1, ("127.0.0.1:21000", "127.0.0.1:21001")))
        with self.assertRaises(ValueError):
            env.from_env({"DM_WORLD_SIZE": "2"})  # no addresses at all
        with self.assertRaises(ValueError):
            env.from_env({"DM_RANK": "2", "DM_AVG_PEERS": "127.0.0.1:1,127.0.0.1:2"})

    def test_table_compares_side_by_side(self):
        def outcome(mode, n, ttt, acc, sent):
            return bench_local.Outcome(mode=mode, workers=n, wall_s=100.0, rcs=[0] * n, result={
                "time_to_target_s": ttt, "test_accuracy": acc, "examples_per_s": 1000.0 * n,
                "bytes_sent": sent, "rounds": 10})
        lines = bench_local.table([outcome("sync", 1, 200.0, 0.905, 0), outcome("diloco", 1, 200.0, 0.905, 0),
                                   outcome("sync", 2, 160.0, 0.906, 4e9), outcome("diloco", 2, 100.0, 0.903, 8e6)])
        text = "\n".join(lines)
        self.assertIn("diloco, 2 workers vs 1: 2.00x sooner to the target", text)
        self.assertIn("sync, 2 workers vs 1: 1.25x sooner to the target", text)
        self.assertIn("diloco vs sync, 2 workers: final accuracy -0.30 points, bytes sent per worker 0.002x", text)


if __name__ == "__main__":
    unittest.main()
