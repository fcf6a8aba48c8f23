"""Minimal safetensors reading/writing (bf16 via ml_dtypes). Reads are bounded: a malformed header
is a ValueError naming the file."""

from __future__ import annotations

import json
import math
import pathlib
import struct
from collections.abc import Iterator

import ml_dtypes
import numpy as np

# safetensors dtype tag <-> our dtype names
ST_TO_NAME = {
    "F32": "float32",
    "BF16": "bfloat16",
    "F16": "float16",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
NAME_TO_ST = {v: k for k, v in ST_TO_NAME.items()}
Specs = dict[str, tuple[tuple[int, ...], str]]  # {tensor name: (shape, dtype name)}
NP_DTYPES = {n: np.dtype(ml_dtypes.bfloat16 if n == "bfloat16" else n) for n in ST_TO_NAME.values()}


def dtype_name(dtype) -> str:
    """numpy / ml_dtypes dtype -> our name ("float32", "bfloat16", ...)."""
    d = np.dtype(dtype)
    for name, nd in NP_DTYPES.items():
        if nd == d:
            return name
    raise ValueError(f"unsupported dtype {d}")


MAX_HEADER_BYTES = 100 << 20


def read_header(path: pathlib.Path, max_header: int = MAX_HEADER_BYTES) -> tuple[dict, int]:
    """-> (header dict without __metadata__, byte offset where tensor data starts). ValueError on
    a header of absurd length, bad JSON, or entries that do not fit the file."""
    path = pathlib.Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError(f"{path.name}: {size} bytes, too short for a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > min(max_header, size - 8):
            raise ValueError(
                f"{path.name}: declared header length {n} exceeds the file ({size} bytes) "
                f"or the {max_header}-byte limit"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path.name}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: header is not a JSON object")
    header.pop("__metadata__", None)
    data_size = size - 8 - n
    for name, ent in header.items():
        try:
            dt = NP_DTYPES[ST_TO_NAME[ent["dtype"]]]
            shape = [int(d) for d in ent["shape"]]
            b, end = (int(x) for x in ent["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path.name}: tensor {name!r}: malformed header entry") from None
        if any(d < 0 for d in shape):
            raise ValueError(f"{path.name}: tensor {name!r}: negative dimension in shape {shape}")
        if not 0 <= b <= end <= data_size or end - b != math.prod(shape) * dt.itemsize:
            raise ValueError(
                f"{path.name}: tensor {name!r}: data range [{b}, {end}) does not match shape "
                f"{shape} {ent['dtype']} inside the {data_size}-byte data section"
            )
    return header, 8 + n


def safetensors_files(model_dir: str | pathlib.Path) -> list[pathlib.Path]:
    files = sorted(pathlib.Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return files


def read_specs(model_dir: str | pathlib.Path) -> Specs:
    """{hf_name: (shape, dtype_name)} over every *.safetensors file in a directory."""
    specs: Specs = {}
    for f in safetensors_files(model_dir):
        header, _ = read_header(f)
        for name, e in header.items():
            specs[name] = (tuple(int(s) for s in e["shape"]), ST_TO_NAME[e["dtype"]])
    return specs


def _mapped(model_dir: str | pathlib.Path) -> Iterator[tuple[str, str, list, np.ndarray]]:
    """(name, dtype name, shape, its bytes as a memory-mapped uint8 view) of every tensor."""
    for f in safetensors_files(model_dir):
        header, start = read_header(f)
        mm = np.memmap(f, dtype=np.uint8, mode="r")
        for name, e in header.items():
            b, end = e["data_offsets"]
            yield name, ST_TO_NAME[e["dtype"]], e["shape"], mm[start + b : start + end]
        del mm


def iter_tensors(model_dir: str | pathlib.Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) one tensor at a time (memory-mapped, copied on read)."""
    for name, dt, shape, raw in _mapped(model_dir):
        yield name, np.frombuffer(raw.tobytes(), dtype=NP_DTYPES[dt]).reshape(shape)


def first_nonfinite(model_dir: str | pathlib.Path, piece: int = 16 << 20) -> str | None:
    """Name of the first float tensor holding a NaN or Inf in a safetensors directory, else None.
    Reads through a memory map in `piece`-byte slices (host memory ~ one slice)."""
    for name, dt, _, raw in _mapped(model_dir):
        if dt not in ("float32", "bfloat16", "float16", "float64"):
            continue
        step = piece - piece % NP_DTYPES[dt].itemsize
        for off in range(0, len(raw), step):
            a = np.frombuffer(raw[off : off + step], dtype=NP_DTYPES[dt])
            if not np.isfinite(a.astype(np.float32) if dt == "bfloat16" else a).all():
                return name
    return None


def layout(tensors: list[tuple[str, tuple[int, ...], str, int]]) -> tuple[bytes, list[int]]:
    """Plan one safetensors file for (name, shape, dtype, nbytes) in order -> (header bytes with the
    length prefix, a multiple of 64 bytes; each tensor's file offset)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offsets, pos = [], 0
    for name, shape, dt, nbytes in tensors:
        header[name] = {
            "dtype": NAME_TO_ST[dt],
            "shape": list(shape),
            "data_offsets": [pos, pos + nbytes],
        }
        offsets.append(pos)
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    # spaces (allowed by the format) so that the data starts 64-byte aligned: a tensor whose
    # offset is a multiple of 64 can be handed to XLA without a copy (memory staging's load)
    raw += b" " * (-(len(raw) + 8) % 64)
    prefix = struct.pack("<Q", len(raw)) + raw
    return prefix, [len(prefix) + o for o in offsets]


def write_file(path: str | pathlib.Path, named: dict[str, np.ndarray]) -> None:
    """Write a dict of numpy arrays as one safetensors file (for tests and tools)."""
    items = [(k, np.ascontiguousarray(v)) for k, v in named.items()]
    prefix, offs = layout([(k, v.shape, dtype_name(v.dtype), v.nbytes) for k, v in items])
    with open(path, "wb") as f:
        f.write(prefix)
        for (_, v), o in zip(items, offs):
            f.seek(o)
            f.write(v.tobytes())
