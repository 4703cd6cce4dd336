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

    def test_a_connection_to_itself_is_refused_and_frees_the_port(self):
        # TCP's simultaneous open, made on purpose: a socket bound to a
        # port dials that same port, as a redial to a dead peer of this
        # host can when the kernel picks the peer's port as its source.
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.connect(("127.0.0.1", port))
        with self.assertRaises(ConnectionRefusedError):
            wire.refuse_self(s)
        self.assertEqual(s.fileno(), -1)  # closed
        ls = socket.socket()  # the peer, restarting, can listen there again (as the averager does)
        with ls:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(("127.0.0.1", port))
            ls.listen(1)
            a = wire.dial("127.0.0.1:%d" % port, 5)  # an ordinary connection passes
            b, _ = ls.accept()
            with a, b:
                self.assertNotEqual(a.fileno(), -1)


if __name__ == "__main__":
    unittest.main()
