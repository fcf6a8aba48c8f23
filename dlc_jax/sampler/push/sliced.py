"""Receiving a sliced multi-sender push: every trainer process streams the slices it owns as one
"part" of a push group (its own PushWeights stream; wire: sampler.proto fields 70-73), and the
coordinator's last stream (header with group_commit, Commit) applies the group, only when every
part ended cleanly and every tensor is tiled exactly. On the socket data plane each announced
slice's bytes follow in order on the part's data connection; parts may mix planes."""

from __future__ import annotations

import collections
import math
import pathlib
import socket
import threading
from collections.abc import Sequence

import numpy as np

from ..wire import safetensors_io as st
from ..wire import sampler_pb2 as pb
from .staging import WeightStager
from .weight_checks import Checksum, FiniteCheck, PushError, given_checksums

# the header fields every part of a group must repeat
_GROUP_FIELDS = "version tensors dtype checksum push_group push_parts relay_to relay_fanout".split()


class SliceTiling:
    """The slices (boxes) received of one tensor; `covered` counts the verified elements."""

    def __init__(self, name: str, shape: Sequence[int]):
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.total = math.prod(self.shape)
        self.boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self.covered = 0

    def add(self, start: Sequence[int], stop: Sequence[int]) -> int:
        """Register the box [start, stop); -> its element count. PushError when it has the wrong
        rank, is empty or out of bounds, or overlaps a box registered before."""
        a, b = tuple(int(x) for x in start), tuple(int(x) for x in stop)
        box = f"[{list(a)}, {list(b)})"
        if len(a) != len(self.shape) or len(b) != len(self.shape):
            raise PushError.invalid(
                f"tensor {self.name!r}: slice {box} does not have rank {len(self.shape)}"
            )
        if any(not 0 <= lo < hi <= d for lo, hi, d in zip(a, b, self.shape)):
            raise PushError.invalid(
                f"tensor {self.name!r}: slice {box} is empty or out of bounds of shape "
                f"{list(self.shape)}"
            )
        for c, d in self.boxes:
            if all(lo < d_hi and c_lo < hi for lo, hi, c_lo, d_hi in zip(a, b, c, d)):
                raise PushError.invalid(
                    f"tensor {self.name!r}: slice {box} overlaps slice [{list(c)}, {list(d)})"
                )
        self.boxes.append((a, b))
        return math.prod(hi - lo for lo, hi in zip(a, b))

    @property
    def complete(self) -> bool:
        return self.covered == self.total


class _OpenSlice:
    """A slice being received: its box, its bytes, their running checks, (socket) its trailer."""

    def __init__(self, index: int, start: Sequence[int], stop: Sequence[int], spec, algo: str):
        self.index, self.start, self.stop = index, tuple(map(int, start)), tuple(map(int, stop))
        self.elements = math.prod(hi - lo for lo, hi in zip(self.start, self.stop))
        self.nbytes = self.elements * st.NP_DTYPES[spec.dtype].itemsize
        self.buf = bytearray()
        self.got = 0
        self.hash = Checksum(algo)
        self.finite = FiniteCheck(spec.dtype)
        self.trailer: pb.TensorDone | None = None


class SlicedStager(WeightStager):
    """All parts of one push group: `header` opens a part (the first creates the staging), `slice`
    / `chunk` / `done` receive slices, `end_part` closes a part, `apply` checks the group."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group = ""
        self.parts = 0
        self.parts_done: set[int] = set()
        self._part: int | None = None  # the part whose stream is being received
        self._fingerprint: bytes = b""
        self._tilings: list[SliceTiling] = []
        self._open: _OpenSlice | None = None  # announced on the stream, its TensorDone not yet in
        # socket plane: slices announced, bytes not read yet; `_data_end`: the part ended
        self._cv = threading.Condition()
        self._announced: collections.deque[_OpenSlice] = collections.deque()
        self._data_end = False

    # -- header -----------------------------------------------------------------------------
    def header(self, h: pb.WeightHeader) -> None:
        if h.push_parts == 0 or not h.push_group or h.group_commit:
            raise PushError.invalid("a sliced push part needs push_group and push_parts > 0")
        if not 0 <= h.push_part < h.push_parts:
            raise PushError.invalid(f"push_part {h.push_part} not in [0, {h.push_parts})")
        plane = h.data_plane or "grpc"
        if plane not in ("grpc", "socket"):
            raise PushError.invalid(f"header.data_plane {h.data_plane!r} not 'grpc' or 'socket'")
        if self._part is not None:
            raise PushError.invalid("second header in one push")
        same = pb.WeightHeader(**{f: getattr(h, f) for f in _GROUP_FIELDS})
        fingerprint = same.SerializeToString(deterministic=True)
        if self.dir is None:  # the group's first part: the header's checks, the staging file
            super().header(h)
            self.group, self.parts, self._fingerprint = h.push_group, int(h.push_parts), fingerprint
            self._tilings = [SliceTiling(s.name, s.shape) for s in self.specs]
            for i, t in enumerate(self._tilings):
                if t.total == 0:
                    self._tensor_complete(i)
        elif fingerprint != self._fingerprint:
            raise PushError.invalid(
                f"push group {h.push_group!r} part {h.push_part}: header differs from the "
                "group's first part (version, dtype, checksum, tensors, part count and relay "
                "must match)"
            )
        if h.push_part in self.parts_done:
            raise PushError.invalid(f"push group {self.group!r}: part {h.push_part} sent twice")
        self._part = int(h.push_part)
        self.data_plane = plane  # this part's plane (push_session claims its data connection)
        with self._cv:
            self._announced.clear()
            self._data_end = False

    # -- slices -----------------------------------------------------------------------------
    def slice(self, m: pb.WeightSlice) -> None:
        s = self._spec(m.tensor_index)
        if self._open is not None:
            raise PushError.invalid(
                f"tensor {s.name!r}: a slice starts before the previous one's TensorDone"
            )
        self._tilings[m.tensor_index].add(m.start, m.stop)
        self._open = o = _OpenSlice(m.tensor_index, m.start, m.stop, s, self.checksum)
        if self.data_plane == "socket":  # its bytes come on the data connection (`read_socket`)
            with self._cv:
                self._announced.append(o)
                self._cv.notify_all()
        else:
            o.buf = bytearray(o.nbytes)

    def _slice_of(self, i: int, what: str) -> _OpenSlice:
        s = self._spec(i)
        o = self._open
        if o is None or o.index != i:
            raise PushError.invalid(f"tensor {s.name!r}: {what} outside a WeightSlice of it")
        return o

    def chunk(self, c) -> None:
        o = self._slice_of(c.tensor_index, "chunk")
        if self.data_plane == "socket":
            raise PushError.invalid(
                "WeightChunk in a sliced part whose bytes come over the socket data plane"
            )
        n = len(c.data)
        if c.offset != o.got or o.got + n > len(o.buf):
            raise PushError.invalid(
                f"tensor {self.specs[o.index].name!r}: slice chunk at offset {c.offset} "
                f"+{n} bytes, expected offset {o.got} within {len(o.buf)} (in order)"
            )
        o.buf[o.got : o.got + n] = c.data
        o.hash.update(c.data)
        o.finite.update(c.data)
        o.got += n
        self.bytes_received += n

    def done(self, d: pb.TensorDone) -> None:
        o = self._slice_of(d.tensor_index, "TensorDone")
        self._open = None
        if self.data_plane == "socket":  # the reader verifies it once its bytes are in too
            with self._cv:
                o.trailer = d
                self._cv.notify_all()
            return
        self._finish(o, d)

    def _finish(self, o: _OpenSlice, d: pb.TensorDone) -> None:
        """All of slice `o`'s bytes are in and `d` is its trailer: check, then scatter it."""
        s = self.specs[o.index]
        where = f"tensor {s.name!r} slice [{list(o.start)}, {list(o.stop)})"
        if o.got != o.nbytes:
            raise PushError.data_loss(f"{where}: received {o.got} of {o.nbytes} bytes")
        if given_checksums(self.checksum, d) != [o.hash.value]:
            raise PushError.data_loss(f"{where}: {self.checksum} missing or mismatched")
        if not o.finite.ok:
            raise PushError.invalid(f"{where}: contains NaN or Inf values (push refused)")
        self._scatter(o)
        o.buf = bytearray()
        t = self._tilings[o.index]
        t.covered += o.elements
        if t.complete:
            self._tensor_complete(o.index)

    # -- socket data plane ------------------------------------------------------------------
    def read_socket(self, conn: socket.socket, piece: int = 8 << 20) -> None:
        """Socket part: each announced slice's bytes from `conn`, verified and scattered once its
        trailer is in, until `end_data`. Blocking (closing `conn` stops it)."""
        if self.dir is None or self.data_plane != "socket":
            raise PushError.precondition("read_socket before a socket-plane header")
        while (o := self._next_announced()) is not None:
            s = self.specs[o.index]
            o.buf = bytearray(o.nbytes)
            view = memoryview(o.buf)
            while o.got < o.nbytes:
                want = min(piece, o.nbytes - o.got)
                k = self._recv(conn, view[o.got : o.got + want], s.name, o.got, o.nbytes)
                o.hash.update(view[o.got : o.got + k])
                o.finite.update(view[o.got : o.got + k])
                o.got += k
                self.bytes_received += k
            del view
            with self._cv:
                while o.trailer is None and not self._data_end:
                    self._cv.wait()
            if o.trailer is None:
                raise PushError.invalid(
                    f"tensor {s.name!r} slice [{list(o.start)}, {list(o.stop)}): part ended "
                    "without its TensorDone"
                )
            self._finish(o, o.trailer)

    def _next_announced(self) -> _OpenSlice | None:
        with self._cv:
            while not self._announced and not self._data_end:
                self._cv.wait()
            return self._announced.popleft() if self._announced else None

    def end_data(self) -> None:
        """The part ended or failed: the socket reader stops after the slices announced so far."""
        with self._cv:
            self._data_end = True
            self._cv.notify_all()

    def _scatter(self, o: _OpenSlice) -> None:
        """Copy the slice's bytes into its box of the mapped tensor (as unsigned ints)."""
        assert self._mm is not None
        s = self.specs[o.index]
        width = st.NP_DTYPES[s.dtype].itemsize
        u = np.dtype(f"u{width}")
        shape = tuple(int(x) for x in s.shape)
        dst = np.frombuffer(self._mm, u, math.prod(shape), self._offsets[o.index]).reshape(shape)
        src = np.frombuffer(o.buf, u).reshape(tuple(b - a for a, b in zip(o.start, o.stop)))
        dst[tuple(slice(a, b) for a, b in zip(o.start, o.stop))] = src
        del dst

    def _tensor_complete(self, i: int) -> None:
        self._received[i] = int(self.specs[i].nbytes)
        self._hand_on(i)  # memory mode: loaded now, and forwarded (its slices all verified)

    def verified_tensor(self, i: int) -> np.ndarray:
        """`tensor_view(i)`, no checksum: no slice's checksum is the assembled tensor's."""
        return self.tensor_view(i)

    def discard(self) -> None:
        """Drop the group and cut its relay (in the background)."""
        forward = self.take_relay()
        if forward is not None:
            threading.Thread(
                target=forward.finish, args=(False,), name="push-relay-cut", daemon=True
            ).start()
        super().discard()

    # -- end of a part, end of the group ----------------------------------------------------
    def end_part(self) -> None:
        """The part's Commit: its last slice must be closed."""
        if self._open is not None:
            raise PushError.invalid("part ended inside a slice (no TensorDone)")
        assert self._part is not None
        self.parts_done.add(self._part)
        self._part = None

    def apply(self) -> pathlib.Path:
        """Check every part ended and every tensor is tiled exactly; -> `_close()`."""
        if self.dir is None:
            raise PushError.precondition("group commit before any part")
        missing = sorted(set(range(self.parts)) - self.parts_done)
        if missing:
            raise PushError.precondition(
                f"push group {self.group!r}: parts {missing} of {self.parts} did not arrive"
            )
        for t in self._tilings:
            if not t.complete:
                raise PushError.invalid(
                    f"tensor {t.name!r}: slices cover {t.covered} of its {t.total} elements "
                    "(they must tile it exactly)"
                )
        return self._close()
