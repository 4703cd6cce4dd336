"""Framing: frames survive a real socket; malformed frames are refused."""

import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from deepmarket.train import wire


class WireTest(unittest.TestCase):
    def setUp(self):
        self.a, self.b = socket.socketpair()
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)

    def test_round_trip(self):
        payload = bytes(range(256)) * 1000  # more than a socket buffer: sent from a thread
        sent = []
        th = threading.Thread(target=lambda: sent.extend([wire.send(self.a, {"t": "push", "round": 3}, payload),
                                                          wire.send(self.a, {"t": "wait"})]))
        th.start()
        h, p, got = wire.recv(self.b)
        th.join()
        n = sent[0]
        self.assertEqual((h, p, got), ({"t": "push", "round": 3}, payload, n))
        self.assertEqual(wire.recv(self.b)[:2], ({"t": "wait"}, b""))

    def test_eof_between_and_inside_frames(self):
        self.a.close()
        with self.assertRaises(EOFError):
            wire.recv(self.b)
        a, b = socket.socketpair()
        with a, b:
            a.sendall(wire.PREFIX.pack(wire.MAGIC, 10, 0) + b"{")
            a.close()
            with self.assertRaises(ConnectionError):
                wire.recv(b)

    def test_refuses_malformed(self):
        cases = [wire.PREFIX.pack(b"HTTP", 2, 0) + b"{}",
                 wire.PREFIX.pack(wire.MAGIC, wire.MAX_HEADER + 1, 0),
                 wire.PREFIX.pack(wire.MAGIC, 4, 0) + b"[1] ",
                 wire.PREFIX.pack(wire.MAGIC, 2, 0) + b"{}"]
        for raw in cases:
            a, b = socket.socketpair()
            with a, b:
                a.sendall(raw)
                with self.assertRaises(wire.ProtocolError, msg=raw[:20]):
                    wire.recv(b)

    def test_split_addr(self):
        self.assertEqual(wire.split_addr("127.0.0.1:21000"), ("127.0.0.1", 21000))
        self.assertEqual(wire.split_addr("[::1]:5"), ("::1", 5))
        with self.assertRaises(ValueError):
            wire.split_addr("localhost")


if __name__ == "__main__":
    unittest.main()
