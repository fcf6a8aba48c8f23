"""Server-side staging of one weight push (header -> chunks -> per-tensor checksums -> commit)
into a preallocated, memory-mapped safetensors file. Every tensor is checksummed and checked finite;
failures raise `PushError`, and the caller `discard()`s. `memory=True`: each verified tensor goes to
the engine's `load` (`backends.base.WeightLoad`) on its own thread while the next arrives."""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import pathlib
import queue
import shutil
import socket
import threading
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from ..wire import safetensors_io as st
from ..wire import sampler_pb2 as pb
from .warm_staging import StagingBuffer, WarmStaging, new_buffer
from .weight_checks import (
    Checksum,
    FiniteCheck,
    PushError,
    given_checksums,
    max_push_bytes,
    validate_specs,
)
from .weight_stream import with_checksum

CHECKSUMS = ("sha256", "crc32c")
_END = object()  # StageWorker: no more items


class StageWorker:
    """`fn(item)` for every `put(item)`, in order, on one daemon thread."""

    def __init__(self, fn: Callable[[object], None], name: str):
        self._fn = fn
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not _END:
            if self.error is not None or self._stop:
                continue
            try:
                self._fn(item)
            except BaseException as e:  # noqa: BLE001 - raised by finish() in the owner
                self.error = e

    def put(self, item: object) -> None:
        self._q.put(item)

    def finish(self) -> None:
        """Wait until every item put so far is handled; raise the first error."""
        self._q.put(_END)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        """Skip the items not started yet and wait for the one in progress (idempotent)."""
        self._stop = True
        if self._thread.is_alive():
            self._q.put(_END)
            self._thread.join()


class WeightStager:
    """One push. `expected`: {hf_name: (shape, dtype)} the backend's model needs (all required)."""

    def __init__(
        self,
        expected: st.Specs,
        current_version: int,
        staging_root: str | None = None,
        *,
        reserve_bytes: int = 0,
        memory: bool = False,
        load=None,
        warm: WarmStaging | None = None,
    ):
        if load is not None and not memory:
            raise ValueError("WeightStager: an engine load needs memory=True")
        if warm is not None and not memory:
            raise ValueError("WeightStager: warm staging buffers need memory=True")
        self.warm = warm  # memory mode: staging buffers kept mapped between pushes
        self._buffer: StagingBuffer | None = None
        self.relay: Any = None  # relay.RelayForward: told of each verified tensor
        self.load = load  # backends.base.WeightLoad or None
        self._mm: mmap.mmap | None = None
        self._mv: memoryview | None = None
        self._loader: StageWorker | None = None
        self.expected, self.current_version = expected, current_version
        self.staging_root, self.reserve_bytes = staging_root, reserve_bytes
        self.dir: pathlib.Path | None = None
        self.version: int | None = None
        self.specs: list[pb.TensorSpec] = []
        self.bytes_received = 0
        self.data_plane = "grpc"
        self._fd = -1  # the staging file, open between header() and commit()/discard()
        self._lock = threading.Lock()  # socket plane: reader thread vs TensorDone on the event loop

    # -- header -----------------------------------------------------------------------------
    def header(self, h: pb.WeightHeader) -> None:
        if self.dir is not None:
            raise PushError.invalid("second header in one push")
        if h.version <= self.current_version:
            raise PushError.precondition(
                f"stale version {h.version}: server already serves version {self.current_version}"
            )
        plane = h.data_plane or "grpc"
        if plane not in ("grpc", "socket"):
            raise PushError.invalid(f"header.data_plane {h.data_plane!r} not 'grpc' or 'socket'")
        algo = h.checksum or "sha256"
        if algo not in CHECKSUMS:
            raise PushError.invalid(f"header.checksum {h.checksum!r} not one of {CHECKSUMS}")
        seen: st.Specs = {}
        for s in h.tensors:
            if s.name in seen:
                raise PushError.invalid(f"tensor {s.name!r} listed twice in the header")
            seen[s.name] = (tuple(int(d) for d in s.shape), s.dtype)
        self.validate(seen)
        for s in h.tensors:
            want = math.prod(int(d) for d in s.shape) * st.NP_DTYPES[s.dtype].itemsize
            if s.nbytes != want:
                raise PushError.invalid(
                    f"tensor {s.name!r}: nbytes {s.nbytes} != {want} for shape {list(s.shape)} "
                    f"{s.dtype}"
                )
        self.checksum, self.data_plane, self.version = algo, plane, int(h.version)
        self.specs = list(h.tensors)
        self._received = [0] * len(self.specs)
        self._hash = [Checksum(algo) for _ in self.specs]
        self._trailer: list[pb.TensorDone | None] = [None] * len(self.specs)
        self._complete = [False] * len(self.specs)  # socket plane: all of the tensor's bytes read
        self._finite = [FiniteCheck(s.dtype) for s in self.specs]
        prefix, self._offsets = st.layout(
            [(s.name, tuple(s.shape), s.dtype, int(s.nbytes)) for s in self.specs]
        )
        payload = sum(int(s.nbytes) for s in self.specs)
        cap = max_push_bytes(self.expected)
        if payload > cap:  # cannot happen after validate_specs; kept as the explicit bound
            raise PushError.invalid(
                f"push of {payload} bytes exceeds the model's largest push ({cap} bytes)"
            )
        total = len(prefix) + payload
        self._hashed = [0] * len(self.specs)  # socket plane: bytes checksummed
        self._sent = [False] * len(self.specs)  # handed to the engine load
        take = self.warm.take if self.warm is not None else new_buffer
        self._buffer = buf = take(total, self.staging_root, self.reserve_bytes, self.version)
        self.dir, self._fd, self._mm = buf.dir, buf.fd, buf.mm
        self._mv = memoryview(self._mm)
        self._mv[: len(prefix)] = prefix
        if self.load is not None:
            self._loader = StageWorker(self._load_tensor, "push-load")

    def validate(self, seen: st.Specs) -> None:
        """The header's {name: (shape, dtype)} against the served model (a full set of weights)."""
        validate_specs(self.expected, seen)

    # -- data -------------------------------------------------------------------------------
    def _spec(self, i: int) -> pb.TensorSpec:
        if self.dir is None:
            raise PushError.precondition("data before header")
        if not 0 <= i < len(self.specs):
            raise PushError.invalid(f"tensor_index {i} out of range [0, {len(self.specs)})")
        return self.specs[i]

    def chunk(self, c) -> None:
        """`c`: a `pb.WeightChunk` or a `chunk_wire.RawChunk` (tensor_index, offset, data)."""
        s = self._spec(c.tensor_index)
        if self.data_plane == "socket":
            raise PushError.invalid(
                "WeightChunk in a push whose bytes come over the socket data plane"
            )
        got = self._received[c.tensor_index]
        if c.offset != got:
            raise PushError.invalid(
                f"tensor {s.name!r}: chunk at offset {c.offset}, expected {got} (chunks must be "
                "in order)"
            )
        if got + len(c.data) > s.nbytes:
            raise PushError.invalid(
                f"tensor {s.name!r}: {got + len(c.data)} bytes exceed its {s.nbytes}"
            )
        at = self._offsets[c.tensor_index] + got
        assert self._mv is not None
        self._mv[at : at + len(c.data)] = c.data
        self._hash[c.tensor_index].update(c.data)
        self._finite[c.tensor_index].update(c.data)
        self._received[c.tensor_index] = got + len(c.data)
        self.bytes_received += len(c.data)

    def done(self, d: pb.TensorDone) -> None:
        s = self._spec(d.tensor_index)
        with self._lock:  # socket plane: verified once both its bytes and this trailer are in
            self._trailer[d.tensor_index] = d
            if self.data_plane != "socket" or self._complete[d.tensor_index]:
                self._verify(d.tensor_index, s)

    def read_socket(self, conn: socket.socket, piece: int = 8 << 20) -> None:
        """Socket data plane: every tensor's bytes from `conn` into the mapped file, each piece
        checked on a second thread while the next arrives. Blocking (closing `conn` stops it)."""
        if self.dir is None or self.data_plane != "socket":
            raise PushError.precondition("read_socket before a socket-plane header")
        assert self._mv is not None
        checker = StageWorker(self._check_piece, "push-verify")
        try:
            for i, s in enumerate(self.specs):
                n, got, base = int(s.nbytes), 0, self._offsets[i]
                if n == 0:
                    checker.put((i, base, 0))
                while got < n:
                    if checker.error is not None:
                        raise checker.error
                    want = min(piece, n - got)
                    k = self._recv(conn, self._mv[base + got : base + got + want], s.name, got, n)
                    self._received[i] = got + k  # before the checker may verify the tensor
                    self.bytes_received += k
                    checker.put((i, base + got, k))
                    got += k
            checker.finish()
        finally:
            checker.cancel()

    def end_data(self) -> None:
        """The push's stream reached Commit or failed (a sliced part's reader stops on it)."""

    def _recv(self, conn: socket.socket, into: memoryview, name: str, got: int, n: int) -> int:
        try:
            k = conn.recv_into(into, len(into), socket.MSG_WAITALL)
        except OSError as e:
            raise PushError.data_loss(
                f"tensor {name!r}: data socket failed after {got} of {n} bytes: {e}"
            ) from None
        if k == 0:
            raise PushError.data_loss(
                f"tensor {name!r}: data socket closed after {got} of {n} bytes"
            )
        return k

    def _check_piece(self, item) -> None:
        i, at, k = item  # type: ignore[misc]
        assert self._mv is not None
        piece = self._mv[at : at + k]
        self._hash[i].update(piece)
        self._finite[i].update(piece)
        self._hashed[i] += k
        if self._hashed[i] == self.specs[i].nbytes:
            with self._lock:
                self._complete[i] = True
                if self._trailer[i] is not None:
                    self._verify(i, self.specs[i])

    def tensor_view(self, i: int) -> np.ndarray:
        """Memory mode: a read-only array over tensor i's staged bytes (keeps the map alive)."""
        s = self.specs[i]
        if self._mm is None:
            raise RuntimeError("tensor_view needs a memory-mode stager between header and commit")
        dt = st.NP_DTYPES[s.dtype]
        arr = np.frombuffer(self._mm, dt, int(s.nbytes) // dt.itemsize, self._offsets[i])
        arr = arr.reshape(tuple(s.shape))
        arr.flags.writeable = False
        return arr

    def verified_tensor(self, i: int) -> np.ndarray:
        """`tensor_view(i)` marked with the checksum it passed (`weight_stream.VerifiedTensor`)."""
        return with_checksum(self.tensor_view(i), self.checksum, self._hash[i].value)

    def _load_tensor(self, i) -> None:
        s = self.specs[i]
        assert self.load is not None
        try:
            self.load.add(s.name, self.tensor_view(i))
        except Exception as e:
            raise PushError(
                grpc.StatusCode.INTERNAL,
                f"tensor {s.name!r}: the engine failed to load it: {type(e).__name__}: {e}",
            ) from e

    def _verify(self, i: int, s: pb.TensorSpec) -> None:
        if self._received[i] != s.nbytes:
            raise PushError.data_loss(
                f"tensor {s.name!r}: received {self._received[i]} of {s.nbytes} bytes"
            )
        want = given_checksums(self.checksum, s, self._trailer[i])
        got = self._hash[i].value
        shown = (lambda x: f"{x[:16]}..") if self.checksum == "sha256" else (lambda x: f"{x:08x}")
        if not want:
            raise PushError.invalid(f"tensor {s.name!r}: no {self.checksum} in header or trailer")
        for w in want:
            if w != got:
                raise PushError.data_loss(
                    f"tensor {s.name!r}: {self.checksum} mismatch (corrupted data): "
                    f"got {shown(got)}, expected {shown(w)}"
                )
        if not self._finite[i].ok:
            raise PushError.invalid(
                f"tensor {s.name!r}: contains NaN or Inf values (push refused; the current "
                "weights keep serving)"
            )
        self._hand_on(i)

    def _hand_on(self, i: int) -> None:
        """Tensor i is verified: load it / forward it (each once)."""
        if not self._sent[i]:
            self._sent[i] = True
            if self._loader is not None:
                self._loader.put(i)
            if self.relay is not None:
                self.relay.verified(i)

    def start_relay(self, forward) -> None:
        """Tell `forward` (a `relay.RelayForward`) of every verified tensor, from now on."""
        self.relay = forward
        for i, done in enumerate(self._sent):
            if done:
                forward.verified(i)

    def take_relay(self):
        """The push's relay, no longer cut by `discard` (the caller finishes it)."""
        forward, self.relay = self.relay, None
        return forward

    def commit(self) -> pathlib.Path:
        """Verify every tensor; -> the staged directory (one safetensors file)."""
        if self.dir is None:
            raise PushError.precondition("commit before header")
        for i, s in enumerate(self.specs):
            self._verify(i, s)
        return self._close()

    def _close(self) -> pathlib.Path:
        """Blocking: the engine's load of the last tensors; -> the staged directory."""
        assert self.dir is not None
        if self._loader is not None:
            self._loader.finish()
        self._unmap()
        if self.warm is None:  # a warm buffer stays open: the service gives it back later
            os.close(self._fd)  # no fsync: a staging file need not survive a crash (redone)
        self._fd = -1
        return self.dir

    def _unmap(self) -> None:
        if self._loader is not None:
            self._loader.cancel()
        if self._mv is not None:
            with contextlib.suppress(BufferError):
                self._mv.release()
            self._mv = None
        if self._mm is not None and self.warm is None:  # a warm buffer's map stays
            with contextlib.suppress(BufferError):  # a view still held: unmapped when collected
                self._mm.close()
        self._mm = None

    def discard(self) -> None:
        self._unmap()
        if self._buffer is not None and self.warm is not None:  # back to the warm buffers
            self._fd = -1
            self.warm.give_back(self._buffer.dir)
            self._buffer, self.dir = None, None  # a second discard must not delete it
            return
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
