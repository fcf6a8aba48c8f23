"""Checks shared by pushes and LoadWeights; failures raise `PushError` (with a gRPC code)."""

from __future__ import annotations

import hashlib
import math
import pathlib

import crc32c
import grpc
import numpy as np

from ..wire import safetensors_io as st

PUSH_DTYPES = ("float32", "bfloat16", "float16")
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


class PushError(Exception):
    """A refused push: the gRPC status `code` to answer and a one-line `message`."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def invalid(cls, message: str) -> PushError:
        return cls(grpc.StatusCode.INVALID_ARGUMENT, message)

    @classmethod
    def precondition(cls, message: str) -> PushError:
        return cls(grpc.StatusCode.FAILED_PRECONDITION, message)

    @classmethod
    def data_loss(cls, message: str) -> PushError:
        return cls(grpc.StatusCode.DATA_LOSS, message)


class Checksum:
    """Incremental "sha256" (`value`: hex digest) or "crc32c" (`value`: int) of a push's bytes."""

    def __init__(self, algo: str):
        self._sha = hashlib.sha256() if algo == "sha256" else None
        self._crc = 0

    def update(self, data) -> None:
        if self._sha is not None:
            self._sha.update(data)
        else:
            self._crc = crc32c.crc32c(data, self._crc)

    @property
    def value(self) -> int | str:
        return self._sha.hexdigest() if self._sha is not None else self._crc


def given_checksums(algo: str, *msgs) -> list:
    """The `algo` checksums the TensorSpec / TensorDone messages `msgs` carry (None skipped)."""
    if algo == "sha256":
        return [m.sha256.lower() for m in msgs if m is not None and m.sha256]
    return [m.crc32c for m in msgs if m is not None and m.HasField("crc32c")]


# (unsigned view dtype, exponent mask): a float is NaN/Inf iff all its exponent bits are set
_EXP_MASKS = {
    "float32": (np.uint32, 0x7F800000),
    "bfloat16": (np.uint16, 0x7F80),
    "float16": (np.uint16, 0x7C00),
    "float64": (np.uint64, 0x7FF0000000000000),
}


class FiniteCheck:
    """Incremental NaN/Inf check over a tensor's raw bytes fed in arbitrary pieces; `update`
    returns False once a non-finite value was seen."""

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


def validate_specs(expected: st.Specs, specs: st.Specs, where: str = "push") -> None:
    """Names, shapes and dtypes of a full set of weights against the served model's. A float
    parameter may come as any of PUSH_DTYPES (the engine casts); any other must match exactly."""
    unknown = sorted(set(specs) - set(expected))
    if unknown:
        raise PushError.invalid(
            f"unknown tensor name {unknown[0]!r} in {where} (not a parameter of the served model)"
        )
    missing = sorted(set(expected) - set(specs))
    if missing:
        raise PushError.invalid(f"{where} is missing {len(missing)} tensor(s), e.g. {missing[:3]}")
    for name, (shape, dtype) in specs.items():
        exp_shape, exp_dtype = expected[name]
        if tuple(shape) != tuple(exp_shape):
            raise PushError.invalid(
                f"tensor {name!r}: shape {list(shape)} != expected {list(exp_shape)}"
            )
        if dtype not in st.NP_DTYPES:
            raise PushError.invalid(f"tensor {name!r}: unsupported dtype {dtype!r}")
        if exp_dtype in FLOAT_DTYPES and dtype not in PUSH_DTYPES:
            raise PushError.invalid(
                f"tensor {name!r}: dtype {dtype!r} not allowed for a float parameter (use one of "
                f"{PUSH_DTYPES})"
            )
        if exp_dtype not in FLOAT_DTYPES and dtype != exp_dtype:
            raise PushError.invalid(f"tensor {name!r}: dtype {dtype!r} != expected {exp_dtype!r}")


def max_push_bytes(expected: st.Specs) -> int:
    """The largest tensor payload a valid push of this model can have (every float as float32)."""

    def itemsize(dtype: str) -> int:  # floats may come as float32; unknown dtypes as 8 bytes
        known = st.NP_DTYPES[dtype].itemsize if dtype in st.NP_DTYPES else 8
        return 4 if dtype in FLOAT_DTYPES else known

    return sum(math.prod(int(d) for d in shape) * itemsize(dt) for shape, dt in expected.values())


def check_load_path(raw: str, load_root: str | None, serving: list[pathlib.Path]) -> pathlib.Path:
    """`raw` resolved, inside `load_root`, a directory, none of `serving`; else PushError."""
    if not load_root:
        raise PushError.precondition(
            "LoadWeights is disabled on this server (start it with --load-root DIR to allow "
            "loading weight directories under DIR)"
        )
    path = pathlib.Path(raw).resolve()
    root = pathlib.Path(load_root).resolve()
    if path != root and root not in path.parents:
        raise PushError.precondition(f"path {raw!r} is outside the load root {load_root}")
    if not path.is_dir():
        raise PushError.invalid(f"path {raw!r} is not a directory")
    if path in {p.resolve() for p in serving}:
        raise PushError.precondition(
            f"path {raw!r} is the directory being served; write the new weights to another "
            "directory"
        )
    return path


def check_load_files(path: pathlib.Path, expected: st.Specs) -> None:
    """Blocking: names/shapes/dtypes against `expected`, bounded header reads, finite values."""
    validate_specs(expected, _read(st.read_specs, path), where=str(path))
    bad = _read(st.first_nonfinite, path)
    if bad is not None:
        raise PushError.invalid(
            f"tensor {bad!r} in {path} contains NaN or Inf values (load refused; the current "
            "weights keep serving)"
        )


def _read(read, path: pathlib.Path):
    """``read(path)``; an unreadable or malformed file is INVALID_ARGUMENT."""
    try:
        return read(path)
    except (OSError, ValueError) as e:
        raise PushError.invalid(f"cannot read safetensors in {path}: {e}") from None
