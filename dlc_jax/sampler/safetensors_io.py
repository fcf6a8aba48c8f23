"""Minimal safetensors reading/writing by header, with no framework: spec listing, streaming
writes at precomputed offsets (host memory ~ one chunk), and numpy reads (bf16 via ml_dtypes).
"""

from __future__ import annotations

import json
import pathlib
import struct
from typing import Iterator

import ml_dtypes
import numpy as np

# safetensors dtype tag <-> our dtype names
ST_TO_NAME = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64",
              "I64": "int64", "I32": "int32", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
NAME_TO_ST = {v: k for k, v in ST_TO_NAME.items()}
NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
             "float16": np.dtype(np.float16), "float64": np.dtype(np.float64), "int64": np.dtype(np.int64),
             "int32": np.dtype(np.int32), "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
             "bool": np.dtype(np.bool_)}


def dtype_name(dtype) -> str:
    """numpy / ml_dtypes dtype -> our name ("float32", "bfloat16", ...)."""
    d = np.dtype(dtype)
    for name, nd in NP_DTYPES.items():
        if nd == d:
            return name
    raise ValueError(f"unsupported dtype {d}")


def read_header(path: pathlib.Path) -> tuple[dict, int]:
    """-> (header dict without __metadata__, byte offset where tensor data starts)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def safetensors_files(model_dir: str | pathlib.Path) -> list[pathlib.Path]:
    files = sorted(pathlib.Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return files


def read_specs(model_dir: str | pathlib.Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """{hf_name: (shape, dtype_name)} over every *.safetensors file in a directory."""
    specs: dict[str, tuple[tuple[int, ...], str]] = {}
    for f in safetensors_files(model_dir):
        header, _ = read_header(f)
        for name, e in header.items():
            specs[name] = (tuple(int(s) for s in e["shape"]), ST_TO_NAME.get(e["dtype"], e["dtype"]))
    return specs


def iter_tensors(model_dir: str | pathlib.Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) one tensor at a time (memory-mapped, copied on read)."""
    for f in safetensors_files(model_dir):
        header, start = read_header(f)
        mm = np.memmap(f, dtype=np.uint8, mode="r")
        for name, e in header.items():
            b, end = e["data_offsets"]
            dt = NP_DTYPES[ST_TO_NAME[e["dtype"]]]
            arr = np.frombuffer(mm[start + b:start + end].tobytes(), dtype=dt).reshape(e["shape"])
            yield name, arr
        del mm


def layout(tensors: list[tuple[str, tuple[int, ...], str, int]]) -> tuple[bytes, list[int]]:
    """Plan one safetensors file for (name, shape, dtype, nbytes) in order.
    -> (header bytes incl. the 8-byte length prefix, absolute file offset of each tensor)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offsets, pos = [], 0
    for name, shape, dt, nbytes in tensors:
        header[name] = {"dtype": NAME_TO_ST[dt], "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        offsets.append(pos)
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
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
