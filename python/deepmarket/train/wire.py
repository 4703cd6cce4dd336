"""The averaging protocol's framing over plain TCP.

A frame is a fixed 16-byte prefix, a JSON header and a binary payload:

    magic    4 bytes   b"DMA1" (protocol version 1)
    hlen     uint32    length of the header, big-endian
    plen     uint64    length of the payload, big-endian
    header   hlen bytes of UTF-8 JSON, an object with at least "t" (the type)
    payload  plen bytes (vectors, see codec.py), possibly empty

Frames are read whole or not at all; a bad magic, an oversized header or
payload, or a header that is not a JSON object ends the connection
(ProtocolError). Between machines the node's tunnels encrypt and
authenticate the bytes; this layer trusts its peer to be the same job.
"""

import json
import socket
import struct

MAGIC = b"DMA1"
PREFIX = struct.Struct("!4sIQ")
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 1 << 32


class ProtocolError(Exception):
    """ProtocolError is a frame that does not follow the protocol."""


def send(sock, header, payload=b""):
    """Sends one frame; returns the number of bytes written."""
    h = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    if len(h) > MAX_HEADER or len(payload) > MAX_PAYLOAD:
        raise ProtocolError("frame too large (header %d, payload %d bytes)" % (len(h), len(payload)))
    prefix = PREFIX.pack(MAGIC, len(h), len(payload))
    if len(payload) < 65536:
        sock.sendall(prefix + h + bytes(payload))
    else:
        sock.sendall(prefix + h)
        sock.sendall(payload)
    return PREFIX.size + len(h) + len(payload)


def recv(sock):
    """Reads one frame; returns (header, payload, bytes read).

    Raises EOFError when the peer closed the connection before a frame began,
    ConnectionError when it closed in the middle of one, socket.timeout when
    the socket's timeout passes, ProtocolError for a malformed frame.
    """
    prefix = _read(sock, PREFIX.size, eof_ok=True)
    magic, hlen, plen = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError("bad magic %r (not a DeepMarket averaging peer, or another version)" % magic)
    if hlen > MAX_HEADER or plen > MAX_PAYLOAD:
        raise ProtocolError("frame too large (header %d, payload %d bytes)" % (hlen, plen))
    try:
        header = json.loads(_read(sock, hlen))
    except ValueError as e:
        raise ProtocolError("header is not JSON: %s" % e) from None
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise ProtocolError("header is not an object with a type")
    payload = _read(sock, plen) if plen else b""
    return header, payload, PREFIX.size + hlen + plen


def _read(sock, n, eof_ok=False):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0 and eof_ok:
                raise EOFError("peer closed the connection")
            raise ConnectionError("peer closed the connection in the middle of a frame")
        got += k
    return bytes(buf)


def dial(addr, timeout):
    """Connects to "host:port" with Nagle off."""
    host, port = split_addr(addr)
    sock = socket.create_connection((host, port), timeout=timeout)
    refuse_self(sock)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def refuse_self(sock):
    """Closes a connection to itself and raises ConnectionRefusedError.
    Dialling a port of this host that nothing listens on can connect the
    socket to itself, when the kernel picks that very port as its source
    (TCP's simultaneous open): the dialler would then hold the port a
    restarting peer needs to listen on, and read its own frames."""
    try:
        me, peer = sock.getsockname(), sock.getpeername()
    except OSError:
        return
    if me == peer:
        sock.close()
        raise ConnectionRefusedError("connected to itself at %s:%d: nothing listens there" % me[:2])


def split_addr(addr):
    """Splits "host:port" (or "[v6]:port") into (host, int port)."""
    host, sep, port = str(addr).rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("bad address %r: want host:port" % addr)
    return host.strip("[]") or "127.0.0.1", int(port)
