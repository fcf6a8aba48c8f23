"""Opt-in bulk data plane for weight pushes: raw tensor bytes over one plain TCP connection, while
the PushWeights stream stays the control plane (header, TensorDone checksums, Commit).

Wire: to `InfoResponse.data_port`, a preamble MAGIC (8 bytes), the push id (32 ASCII hex chars, as
in `WeightHeader.data_push_id`), a big-endian uint16 token length and the bearer token (empty when
none); then the tensors' bytes in header order, unframed. No encryption: never offered with TLS."""

from __future__ import annotations

import contextlib
import hmac
import logging
import selectors
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


class DataPlaneListener:
    """Accepts data connections (one selector thread), checks their preamble and parks each under
    its push id until that push claims it; unclaimed ones close after `stale_s`."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str | None,
        *,
        preamble_timeout: float = 5.0,
        stale_s: float = 120.0,
        max_pending: int = 64,
    ):
        self.token = token
        self.preamble_timeout = preamble_timeout
        self.stale_s = stale_s
        self.max_pending = max_pending
        h = host.strip("[]")
        addr = socket.getaddrinfo(h or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self.sock = socket.create_server((h, port), family=addr[0][0], backlog=128)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._pending: dict[str, tuple[socket.socket, float]] = {}  # authenticated, awaiting claim
        self._hello: dict[socket.socket, tuple[bytearray, float]] = {}  # awaiting preamble
        self.refused = 0  # connections closed for a bad/late preamble or over the cap
        self._last_warn, self._warned = -1e9, 0
        self._cond = threading.Condition()
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, daemon=True, name="push-data-accept")
        self._thread.start()

    # -- the selector loop (its own thread) ---------------------------------------------------
    def _drop_hello(self, conn: socket.socket, why: str) -> None:
        self._hello.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn)
        self._refuse(why)  # counted before the close, so a peer that sees the close sees the count
        conn.close()

    def _refuse(self, why: str) -> None:
        """Count a refused connection; log at most one warning per 10 s (a flood stays one line)."""
        self.refused += 1
        now = time.monotonic()
        if now - self._last_warn >= 10.0:
            extra = f" (+{self.refused - self._warned} more refused since the last warning)"
            log.warning("push data connection refused: %s%s", why, extra if self._warned else "")
            self._last_warn, self._warned = now, self.refused

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            timeout = min([d for _, d in self._hello.values()], default=now + 1.0) - now
            events = self._sel.select(max(0.0, min(timeout, 1.0)))
            with self._cond:
                if self._closed:
                    break
            for key, _ in events:
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(64)
                elif key.data == "accept":
                    self._accept()
                else:
                    self._read_hello(key.fileobj)  # type: ignore[arg-type]
            now = time.monotonic()
            for conn, (_, deadline) in list(self._hello.items()):
                if now >= deadline:
                    self._drop_hello(
                        conn, f"no complete preamble within {self.preamble_timeout:g}s"
                    )
        for conn in list(self._hello):
            conn.close()
        self._hello.clear()
        self._sel.close()

    def _accept(self) -> None:
        for _ in range(64):  # drain the backlog a batch at a time
            try:
                conn, _ = self.sock.accept()
            except OSError:  # nothing more to accept now (or the listener closed)
                return
            held = self.held
            if held >= self.max_pending:
                self._refuse(f"{held} connections already held (cap {self.max_pending})")
                conn.close()
                continue
            conn.setblocking(False)
            self._hello[conn] = (bytearray(), time.monotonic() + self.preamble_timeout)
            self._sel.register(conn, selectors.EVENT_READ, "hello")

    def _read_hello(self, conn: socket.socket) -> None:
        buf, _ = self._hello[conn]
        head = len(MAGIC) + PUSH_ID_LEN + 2
        need = head if len(buf) < head else head + struct.unpack(">H", buf[head - 2 : head])[0]
        try:
            data = conn.recv(need - len(buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop_hello(conn, str(e))
            return
        if not data:
            self._drop_hello(conn, "closed during the preamble")
            return
        buf += data
        if len(buf) >= len(MAGIC) and buf[: len(MAGIC)] != MAGIC:
            self._drop_hello(conn, "bad magic")
            return
        if len(buf) < head:
            return
        (tlen,) = struct.unpack(">H", buf[head - 2 : head])
        if tlen > MAX_TOKEN:
            self._drop_hello(conn, "token too long")
            return
        if len(buf) < head + tlen:
            return
        tok = bytes(buf[head : head + tlen])
        if self.token is not None and not hmac.compare_digest(tok, self.token.encode()):
            self._drop_hello(conn, "missing or wrong token")
            return
        try:
            pid = bytes(buf[len(MAGIC) : len(MAGIC) + PUSH_ID_LEN]).decode("ascii")
        except UnicodeDecodeError:
            self._drop_hello(conn, "push id is not ASCII")
            return
        self._hello.pop(conn)
        self._sel.unregister(conn)
        conn.setblocking(True)
        self._park(pid, conn)

    def _park(self, pid: str, conn: socket.socket) -> None:
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

    # -- used by the server --------------------------------------------------------------------
    @property
    def held(self) -> int:
        """Connections held now (awaiting their preamble or their push)."""
        with self._cond:
            return len(self._hello) + len(self._pending)

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
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(5)
        with contextlib.suppress(OSError):
            self.sock.close()
        self._wake_r.close()
        self._wake_w.close()
        for c, _ in pending.values():
            c.close()
