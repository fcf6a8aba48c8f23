"""Server-side staging of one weight push: header -> chunks -> per-tensor checksums -> commit.

Bytes are written straight into a preallocated safetensors file in a fresh temp directory at
precomputed offsets, so host memory stays ~ one chunk. Checksums: the header names one
("sha256", the default, or "crc32c"); every tensor must carry it (in its spec or its TensorDone
trailer) and every value given is checked. Chunks may be `pb.WeightChunk` or
`chunk_wire.RawChunk` (zero-copy memoryview data). The staging root is created if missing. Every
check failure raises `PushError` with the gRPC status code to answer and a message naming the
tensor; the caller deletes the staging directory with `discard()`. Only `commit()` returns the
staged directory.

Limits: the header is checked against the served model (names, shapes, dtypes: `validate_specs`,
shared with LoadWeights), the staged size against the model's largest possible push and against the
free space of the staging filesystem (minus `reserve_bytes`) before anything is written; every float
tensor's values are checked finite as its bytes arrive (`FiniteCheck`), so a NaN/Inf push is refused
even with valid checksums. Staging directories are named `dlc_push_p<pid>_v<version>_*` after the
sampler process that owns them (and hold an `.owner` file naming its pid namespace);
`clean_stale_staging` removes those of dead processes in this pid namespace (a SIGKILLed sampler
cannot clean its /dev/shm copy itself).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import shutil
import socket
import tempfile
import threading
from typing import Any

import crc32c
import grpc
import numpy as np

from . import safetensors_io as st
from . import sampler_pb2 as pb

log = logging.getLogger(__name__)

PUSH_DTYPES = ("float32", "bfloat16", "float16")
CHECKSUMS = ("sha256", "crc32c")
STAGING_PREFIX = "dlc_push_p"


class _Crc32c:
    """Incremental CRC-32C (hardware, GIL released) with the hashlib update() interface."""

    def __init__(self):
        self.value = 0

    def update(self, data) -> None:
        self.value = crc32c.crc32c(data, self.value)


FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


class PushError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# (unsigned view dtype, exponent mask): a float is NaN/Inf iff all its exponent bits are set
_EXP_MASKS = {
    "float32": (np.uint32, 0x7F800000),
    "bfloat16": (np.uint16, 0x7F80),
    "float16": (np.uint16, 0x7C00),
    "float64": (np.uint64, 0x7FF0000000000000),
}


class FiniteCheck:
    """Incremental NaN/Inf check over a tensor's raw bytes fed in arbitrary pieces (elements may
    straddle pieces). `update` returns False once a non-finite value was seen."""

    def __init__(self, dtype: str):
        self.spec = _EXP_MASKS.get(dtype)
        self.itemsize = np.dtype(self.spec[0]).itemsize if self.spec else 1
        self.carry = b""
        self.ok = True

    def _check(self, raw) -> None:
        assert self.spec is not None
        u, m = self.spec
        if u is np.uint16:  # bfloat16 / float16: |x| bits >= the all-ones exponent (exact, fast)
            a = np.frombuffer(raw, dtype=np.uint16)
            if a.size and int(np.bitwise_and(a, np.uint16(0x7FFF)).max()) >= m:
                self.ok = False
            return
        f = np.float32 if u is np.uint32 else np.float64
        if not np.isfinite(np.frombuffer(raw, dtype=f)).all():  # native isfinite: ~4 GB/s
            self.ok = False

    def update(self, data) -> bool:
        if self.spec is None or not self.ok:
            return self.ok
        mv = memoryview(data).cast("B")
        if self.carry:
            need = self.itemsize - len(self.carry)
            self.carry += bytes(mv[:need])
            mv = mv[need:]
            if len(self.carry) < self.itemsize:
                return self.ok
            self._check(self.carry)
            self.carry = b""
        n = len(mv) // self.itemsize * self.itemsize
        if n:
            self._check(mv[:n])
        self.carry = bytes(mv[n:])
        return self.ok


def validate_specs(
    expected: dict[str, tuple[tuple[int, ...], str]],
    specs: dict[str, tuple[tuple[int, ...], str]],
    where: str = "push",
) -> None:
    """Names, shapes and dtypes of a full set of weights against the served model's. A float
    parameter may come as any of PUSH_DTYPES (the engine casts); any other must match exactly."""
    unknown = sorted(set(specs) - set(expected))
    if unknown:
        raise PushError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"unknown tensor name {unknown[0]!r} in {where} (not a parameter of the served model)",
        )
    missing = sorted(set(expected) - set(specs))
    if missing:
        raise PushError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{where} is missing {len(missing)} tensor(s), e.g. {missing[:3]}",
        )
    for name, (shape, dtype) in specs.items():
        exp_shape, exp_dtype = expected[name]
        if tuple(shape) != tuple(exp_shape):
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor {name!r}: shape {list(shape)} != expected {list(exp_shape)}",
            )
        if dtype not in st.NP_DTYPES:
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT, f"tensor {name!r}: unsupported dtype {dtype!r}"
            )
        if exp_dtype in FLOAT_DTYPES and dtype not in PUSH_DTYPES:
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor {name!r}: dtype {dtype!r} not allowed for a float parameter (use one of "
                f"{PUSH_DTYPES})",
            )
        if exp_dtype not in FLOAT_DTYPES and dtype != exp_dtype:
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor {name!r}: dtype {dtype!r} != expected {exp_dtype!r}",
            )


def max_push_bytes(expected: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """The largest tensor payload a valid push of this model can have (every float as float32)."""
    total = 0
    for shape, dtype in expected.values():
        n = 1
        for d in shape:
            n *= int(d)
        isz = (
            4
            if dtype in FLOAT_DTYPES
            else st.NP_DTYPES[dtype].itemsize
            if dtype in st.NP_DTYPES
            else 8
        )
        total += n * isz
    return total


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_roots(staging_root: str | None) -> list[pathlib.Path]:
    """Directories a server with this `staging_root` setting may stage into."""
    if staging_root not in (None, "", "auto"):
        return [pathlib.Path(staging_root)]
    return [pathlib.Path(SHM_DIR), pathlib.Path(tempfile.gettempdir())]


def _owner(d: pathlib.Path) -> int | None:
    rest = d.name[len(STAGING_PREFIX) :]
    head = rest.split("_", 1)[0]
    return int(head) if head.isdigit() else None


OWNER_FILE = ".owner"  # "<pid namespace> <pid>": who staged this directory


def pid_namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]"; "" where unknown): pids are only
    comparable inside one namespace (containers sharing /dev/shm may each have a pid 7)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _same_namespace(d: pathlib.Path) -> bool:
    try:
        ns = (d / OWNER_FILE).read_text().split()[0]
    except (OSError, IndexError):
        return True  # no marker (older sampler, or being created): the name's pid decides
    return ns == pid_namespace()


def clean_stale_staging(roots: list[pathlib.Path], *, pid: int | None = None) -> list[str]:
    """Remove staging directories whose owner process is dead (or, with `pid`, those owned by that
    pid, which the caller knows is dead). -> the removed paths."""
    removed = []
    for root in roots:
        try:
            entries = list(root.iterdir())
        except OSError:
            continue
        for d in entries:
            if not d.name.startswith(STAGING_PREFIX) or not d.is_dir():
                continue
            owner = _owner(d)
            if owner is None or owner == os.getpid() or not _same_namespace(d):
                continue
            if (pid is not None and owner == pid) or (pid is None and not _pid_alive(owner)):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
    if removed:
        log.info("removed %d staging dir(s) of dead sampler(s): %s", len(removed), removed[:3])
    return removed


SHM_DIR = "/dev/shm"


def resolve_staging_root(
    staging_root: str | None, nbytes: int, *, shm_dir: str = SHM_DIR, headroom: float = 2.0
) -> str | None:
    """Where a push of `nbytes` is staged. An explicit directory wins. 'auto' (or None) picks the
    RAM filesystem `shm_dir` when it has room for `headroom` x the push (the staged file lives only
    until the engine has reloaded it, and RAM-backed staging avoids a disk write per push), else
    the system temp directory (returned as None)."""
    if staging_root not in (None, "", "auto"):
        return staging_root
    try:
        free = shutil.disk_usage(shm_dir).free
    except OSError:
        return None
    return shm_dir if free >= headroom * nbytes else None


class WeightStager:
    """One push. `expected`: {hf_name: (shape, dtype)} the backend's model needs (all required)."""

    def __init__(
        self,
        expected: dict[str, tuple[tuple[int, ...], str]],
        current_version: int,
        staging_root: str | None = None,
        *,
        reserve_bytes: int = 0,
    ):
        self.expected = expected
        self.reserve_bytes = reserve_bytes
        self.current_version = current_version
        self.staging_root = staging_root
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
            raise PushError(grpc.StatusCode.INVALID_ARGUMENT, "second header in one push")
        if h.version <= self.current_version:
            raise PushError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"stale version {h.version}: server already serves version {self.current_version}",
            )
        plane = h.data_plane or "grpc"
        if plane not in ("grpc", "socket"):
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"header.data_plane {h.data_plane!r} not 'grpc' or 'socket'",
            )
        algo = h.checksum or "sha256"
        if algo not in CHECKSUMS:
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"header.checksum {h.checksum!r} not one of {CHECKSUMS}",
            )
        seen: dict[str, tuple[tuple[int, ...], str]] = {}
        for s in h.tensors:
            if s.name in seen:
                raise PushError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"tensor {s.name!r} listed twice in the header",
                )
            seen[s.name] = (tuple(int(d) for d in s.shape), s.dtype)
        validate_specs(self.expected, seen)
        for s in h.tensors:
            n = 1
            for d in s.shape:
                n *= int(d)
            want = n * st.NP_DTYPES[s.dtype].itemsize
            if s.nbytes != want:
                raise PushError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"tensor {s.name!r}: nbytes {s.nbytes} != {want} for shape {list(s.shape)} "
                    f"{s.dtype}",
                )
        self.checksum = algo
        self.data_plane = plane
        self.version = int(h.version)
        self.specs = list(h.tensors)
        self._received = [0] * len(self.specs)
        self._hash: list[Any] = [
            hashlib.sha256() if algo == "sha256" else _Crc32c() for _ in self.specs
        ]
        self._trailer: list[pb.TensorDone | None] = [None] * len(self.specs)
        self._complete = [False] * len(self.specs)  # socket plane: all of the tensor's bytes read
        self._finite = [FiniteCheck(s.dtype) for s in self.specs]
        prefix, self._offsets = st.layout(
            [(s.name, tuple(s.shape), s.dtype, int(s.nbytes)) for s in self.specs]
        )
        payload = sum(int(s.nbytes) for s in self.specs)
        cap = max_push_bytes(self.expected)
        if payload > cap:  # cannot happen after validate_specs; kept as the explicit bound
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"push of {payload} bytes exceeds the model's largest push ({cap} bytes)",
            )
        total = len(prefix) + payload
        root = resolve_staging_root(self.staging_root, total)
        if root is not None:
            pathlib.Path(root).mkdir(parents=True, exist_ok=True)
        where = root if root is not None else tempfile.gettempdir()
        try:
            free = shutil.disk_usage(where).free
        except OSError as e:
            raise PushError(
                grpc.StatusCode.FAILED_PRECONDITION, f"staging directory {where}: {e}"
            ) from None
        if free - self.reserve_bytes < total:
            raise PushError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"not enough space to stage the push: needs {total / 1e6:.1f} MB, {where} has "
                f"{free / 1e6:.1f} MB free with {self.reserve_bytes / 1e6:.1f} MB kept in reserve",
            )
        self.dir = pathlib.Path(
            tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}_v{self.version}_", dir=root)
        )
        (self.dir / OWNER_FILE).write_text(f"{pid_namespace()} {os.getpid()}\n")
        self._path = self.dir / "model.safetensors"
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.pwrite(self._fd, prefix, 0)
        os.ftruncate(self._fd, total)

    # -- data -------------------------------------------------------------------------------
    def _spec(self, i: int) -> pb.TensorSpec:
        if self.dir is None:
            raise PushError(grpc.StatusCode.FAILED_PRECONDITION, "data before header")
        if not 0 <= i < len(self.specs):
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor_index {i} out of range [0, {len(self.specs)})",
            )
        return self.specs[i]

    def chunk(self, c) -> None:
        """`c`: a `pb.WeightChunk` or a `chunk_wire.RawChunk` (tensor_index, offset, data)."""
        s = self._spec(c.tensor_index)
        if self.data_plane == "socket":
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "WeightChunk in a push whose bytes come over the socket data plane",
            )
        got = self._received[c.tensor_index]
        if c.offset != got:
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor {s.name!r}: chunk at offset {c.offset}, expected {got} (chunks must be "
                "in order)",
            )
        if got + len(c.data) > s.nbytes:
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor {s.name!r}: {got + len(c.data)} bytes exceed its {s.nbytes}",
            )
        os.pwrite(self._fd, c.data, self._offsets[c.tensor_index] + got)
        self._hash[c.tensor_index].update(c.data)
        self._finite[c.tensor_index].update(c.data)
        self._received[c.tensor_index] = got + len(c.data)
        self.bytes_received += len(c.data)

    def done(self, d: pb.TensorDone) -> None:
        s = self._spec(d.tensor_index)
        if self.data_plane == "socket":  # verified once both its bytes and this trailer are in
            with self._lock:
                self._trailer[d.tensor_index] = d
                if self._complete[d.tensor_index]:
                    self._verify(d.tensor_index, s)
            return
        self._trailer[d.tensor_index] = d
        self._verify(d.tensor_index, s)

    def read_socket(self, conn: socket.socket, piece: int = 8 << 20) -> None:
        """Socket data plane: read every tensor's bytes, in header order, from `conn` into the
        staging file (through one `piece`-byte buffer: host memory ~ one piece), checksumming as it
        goes; each tensor whose trailer is already in is verified right away. Blocking (run it in a
        worker thread; closing `conn` from elsewhere stops it). Raises PushError."""
        if self.dir is None or self.data_plane != "socket":
            raise PushError(
                grpc.StatusCode.FAILED_PRECONDITION, "read_socket before a socket-plane header"
            )
        buf = bytearray(piece)
        view = memoryview(buf)
        for i, s in enumerate(self.specs):
            n, got, base = int(s.nbytes), 0, self._offsets[i]
            h = self._hash[i]
            while got < n:
                want = min(piece, n - got)
                try:
                    k = conn.recv_into(view, want, socket.MSG_WAITALL)
                except OSError as e:
                    raise PushError(
                        grpc.StatusCode.DATA_LOSS,
                        f"tensor {s.name!r}: data socket failed after {got} of {n} bytes: {e}",
                    ) from None
                if k == 0:
                    raise PushError(
                        grpc.StatusCode.DATA_LOSS,
                        f"tensor {s.name!r}: data socket closed after {got} of {n} bytes",
                    )
                chunk = view[:k]
                h.update(chunk)
                self._finite[i].update(chunk)
                os.pwrite(self._fd, chunk, base + got)
                got += k
                self._received[i] = got
                self.bytes_received += k
            with self._lock:
                self._complete[i] = True
                if self._trailer[i] is not None:
                    self._verify(i, s)

    def _verify(self, i: int, s: pb.TensorSpec) -> None:
        if self._received[i] != s.nbytes:
            raise PushError(
                grpc.StatusCode.DATA_LOSS,
                f"tensor {s.name!r}: received {self._received[i]} of {s.nbytes} bytes",
            )
        t = self._trailer[i]
        if self.checksum == "sha256":
            want = [c.lower() for c in (s.sha256, t.sha256 if t is not None else "") if c]
            got = self._hash[i].hexdigest()
            shown = lambda x: f"{x[:16]}.."
        else:
            want = [m.crc32c for m in (s, t) if m is not None and m.HasField("crc32c")]
            got = self._hash[i].value
            shown = lambda x: f"{x:08x}"
        if not want:
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor {s.name!r}: no {self.checksum} in header or trailer",
            )
        for w in want:
            if w != got:
                raise PushError(
                    grpc.StatusCode.DATA_LOSS,
                    f"tensor {s.name!r}: {self.checksum} mismatch (corrupted data): "
                    f"got {shown(got)}, expected {shown(w)}",
                )
        if not self._finite[i].ok:
            raise PushError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor {s.name!r}: contains NaN or Inf values (push refused; the current "
                "weights keep serving)",
            )

    def commit(self) -> pathlib.Path:
        """Verify every tensor; -> the staged directory (one safetensors file)."""
        if self.dir is None:
            raise PushError(grpc.StatusCode.FAILED_PRECONDITION, "commit before header")
        for i, s in enumerate(self.specs):
            self._verify(i, s)
        os.close(self._fd)  # no fsync: a staging file need not survive a crash (the push is redone)
        self._fd = -1
        return self.dir

    def discard(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
