"""Opt-in out-of-band bulk data plane for weight pushes: raw tensor bytes over one plain TCP
connection, while the PushWeights gRPC stream stays the control plane (header, TensorDone
checksums, Commit). Python gRPC copies every message several times; a raw socket carries the bytes
straight from the trainer's numpy buffer (`sendall(memoryview)`) into the server's staging file.

Wire: the client opens a TCP connection to `InfoResponse.data_port` (same host as gRPC) and sends a
preamble: MAGIC (8 bytes), the push id (32 ASCII hex chars, the same one it puts in
`WeightHeader.data_push_id`), a big-endian uint16 token length and the token (the server's bearer
token; empty when the server needs none). Then every tensor's bytes, in header order, no framing.
The server stages them exactly like gRPC chunks (every tensor's CRC-32C/sha256 verified against the
TensorDone trailer, atomic swap only on Commit, staging deleted on any failure).

No encryption: use it only on loopback or a trusted network. A server with TLS offers no data port.
"""

from __future__ import annotations

import hmac
import logging
import socket
import struct
import threading
import time

log = logging.getLogger(__name__)

MAGIC = b"DLCPUSH1"
PUSH_ID_LEN = 32
MAX_TOKEN = 4096


def preamble(push_id: str, token: str | None) -> bytes:
    pid = push_id.encode("ascii")
    if len(pid) != PUSH_ID_LEN:
        raise ValueError(f"push id must be {PUSH_ID_LEN} ASCII chars, got {len(pid)}")
    tok = (token or "").encode()
    if len(tok) > MAX_TOKEN:
        raise ValueError("token too long for the data plane preamble")
    return MAGIC + pid + struct.pack(">H", len(tok)) + tok


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("closed during the preamble")
        got += k
    return bytes(buf)


class DataPlaneListener:
    """Accepts data connections, checks their preamble (magic, token) and parks each under its push
    id until the PushWeights call naming that id claims it. Unclaimed connections are closed after
    `stale_s`."""

    def __init__(self, host: str, port: int, token: str | None, *, preamble_timeout: float = 10.0,
                 stale_s: float = 120.0):
        self.token = token
        self.preamble_timeout = preamble_timeout
        self.stale_s = stale_s
        h = host.strip("[]")
        fam = socket.getaddrinfo(h or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.sock = socket.create_server((h, port), family=fam)
        self.port = self.sock.getsockname()[1]
        self._pending: dict[str, tuple[socket.socket, float]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="push-data-accept")
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(conn,), daemon=True, name="push-data-hello").start()

    def _handshake(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(self.preamble_timeout)
            head = _recv_exact(conn, len(MAGIC) + PUSH_ID_LEN + 2)
            if head[:len(MAGIC)] != MAGIC:
                raise ValueError("bad magic")
            pid = head[len(MAGIC):len(MAGIC) + PUSH_ID_LEN].decode("ascii")
            (tlen,) = struct.unpack(">H", head[-2:])
            if tlen > MAX_TOKEN:
                raise ValueError("token too long")
            tok = _recv_exact(conn, tlen)
            if self.token is not None and not hmac.compare_digest(tok, self.token.encode()):
                raise PermissionError("missing or wrong token")
        except Exception as e:  # noqa: BLE001 - a bad data connection is just dropped
            log.warning("push data connection refused: %s", e)
            conn.close()
            return
        conn.settimeout(None)
        now = time.monotonic()
        with self._cond:
            if self._closed:
                conn.close()
                return
            for k, (c, t) in list(self._pending.items()):  # drop connections nobody claimed
                if now - t > self.stale_s:
                    c.close()
                    del self._pending[k]
            old = self._pending.pop(pid, None)
            if old is not None:  # a push id is one-time: a second connection voids both
                old[0].close()
                conn.close()
                log.warning("push data connection: push id reused; both dropped")
                return
            self._pending[pid] = (conn, now)
            self._cond.notify_all()

    def claim(self, push_id: str, timeout: float) -> socket.socket | None:
        """The data connection for `push_id` (waiting up to `timeout` s for it), or None."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while push_id not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return None
                self._cond.wait(left)
            return self._pending.pop(push_id)[0]

    def drop(self, push_id: str) -> None:
        with self._cond:
            e = self._pending.pop(push_id, None)
        if e is not None:
            e[0].close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._pending = self._pending, {}
            self._cond.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for c, _ in pending.values():
            c.close()
