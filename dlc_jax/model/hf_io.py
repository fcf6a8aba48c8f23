"""HF names/shapes of a model's parameters, layout conversion, and `save_hf`: stream one gathered
tensor at a time into safetensors shards planned from the shapes (host memory ~ one tensor).
Loading: `hf_load.load_hf`."""

from __future__ import annotations

import functools
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .qwen3 import Qwen3ForCausalLM
from .registry import family_of

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint tensor is missing, misshaped or unexpected (the message names it)."""


def hf_param_shapes(config) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> HF shape, in checkpoint order (no lm_head.weight when tied)."""
    return family_of(config).hf_param_shapes(config)


def _hf_name(path: tuple) -> str:
    parts = [str(p) for p in path]
    if parts[-1] == "kernel":
        parts[-1] = "weight"
    return ".".join(parts)


def _param_slots(state, num_layers: int) -> dict[str, tuple[tuple, tuple[int, ...]]]:
    """HF name -> (nnx state path, leading indices: () or into layers and/or experts) per Param."""
    out: dict[str, tuple[tuple, tuple[int, ...]]] = {}
    for path, var in nnx.to_flat_state(state):
        layer_axis = path[:2] == ("model", "layers") and not isinstance(path[2], int)
        pos = path.index("experts") if "experts" in path else -1
        expert_axis = pos >= 0 and not isinstance(path[pos + 1], int)
        layers = range(num_layers) if layer_axis else [None]
        n_exp = var.shape[int(layer_axis)] if expert_axis else 0
        for i in layers:
            for e in range(n_exp) if expert_axis else [None]:
                parts: list = list(path)
                if expert_axis:
                    parts.insert(pos + 1, e)
                if layer_axis:
                    parts.insert(2, i)
                idx = tuple(x for x in (i, e) if x is not None)
                out[_hf_name(tuple(parts))] = (path, idx)
    return out


def _to_ours(hf: np.ndarray, path: tuple, our_shape: tuple) -> np.ndarray:
    """HF layout -> our layout: projection kernels are transposed then reshaped; others as is."""
    return np.ascontiguousarray(hf.T).reshape(our_shape) if path[-1] == "kernel" else hf


def _gather(x: jax.Array) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _np_dtype(dtype):
    return None if dtype is None else np.dtype(jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnames=("hf_shape", "kernel", "transpose", "dtype"))
def _to_hf_on_device(
    x: jax.Array, idx, *, hf_shape: tuple, kernel: bool, transpose: bool = True, dtype
) -> jax.Array:
    """HF layout and export dtype computed on device, so the device->host copy moves export bytes.
    `idx`: leading indices into a stacked parameter (see `_param_slots`). A kernel comes back as
    [out, in] (HF) with `transpose`, else [in, out] for `_host_transpose`."""
    for i in idx:
        x = jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
    if kernel:
        x = x.reshape(hf_shape[::-1])
        if transpose:
            x = x.T
    return x if dtype is None else x.astype(dtype)


def _as_uint(a: np.ndarray) -> np.ndarray:
    """`a` viewed as unsigned ints of its width (their copies release the GIL), else `a` itself."""
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a


def _host_transpose(a: np.ndarray, block_rows: int = 64) -> np.ndarray:
    """`a.T` (2-D) as a new C-contiguous array, bit-identical, copied `block_rows` rows at a time
    (cache-friendly: 3-5x cheaper than `np.ascontiguousarray(a.T)` or XLA:CPU's transpose)."""
    rows, cols = a.shape
    out = np.empty((cols, rows), a.dtype)
    src, dst = _as_uint(a), _as_uint(out)
    for i in range(0, rows, block_rows):
        dst[:, i : i + block_rows] = src[i : i + block_rows].T
    return out


def hf_device_tensors(
    model: Qwen3ForCausalLM, *, dtype=np.float32, host_transpose: bool | None = None
) -> Iterator[tuple[str, jax.Array, bool]]:
    """Yield (HF name, device array, on_host) one tensor at a time in `hf_param_shapes` order (the
    same on every process), the next dispatched before yielding (device work overlaps the caller's
    copy). Slice and cast (`dtype` None: keep) run on device, as does a kernel's transpose to HF
    [out, in] unless `on_host` (the caller's, after the gather; `host_transpose` None: on CPU)."""
    params = nnx.state(model, nnx.Param)
    flat = dict(nnx.to_flat_state(params))
    slots = _param_slots(params, model.config.num_hidden_layers)
    npdt = _np_dtype(dtype)

    def dispatch(name: str, hf_shape: tuple) -> tuple[str, jax.Array, bool]:
        p, idx = slots[name]
        value = flat[p].get_value()
        kernel = p[-1] == "kernel"
        on_cpu = all(d.platform == "cpu" for d in value.devices())
        on_host = kernel and (on_cpu if host_transpose is None else host_transpose)
        x = _to_hf_on_device(
            value,
            tuple(jnp.int32(i) for i in idx),
            hf_shape=tuple(hf_shape),
            kernel=kernel,
            transpose=not on_host,
            dtype=None if npdt is None else jnp.dtype(npdt),
        )
        return name, x, on_host

    pending = None
    for name, hf_shape in hf_param_shapes(model.config).items():
        nxt = dispatch(name, hf_shape)
        if pending is not None:
            yield pending
        pending = nxt
    if pending is not None:
        yield pending


def iter_hf_tensors(
    model: Qwen3ForCausalLM, *, dtype=np.float32, host_transpose: bool | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """`hf_device_tensors` (same arguments) gathered to host as (HF name, HF-layout numpy array)."""
    for name, x, on_host in hf_device_tensors(model, dtype=dtype, host_transpose=host_transpose):
        a = _gather(x)
        yield name, _host_transpose(a) if on_host else np.ascontiguousarray(a)


_ST_DTYPES = {
    "float32": "F32",
    "bfloat16": "BF16",
    "float16": "F16",
    "float64": "F64",
    "int32": "I32",
}


def _write_safetensors_stream(
    file: Path, entries: list[tuple[str, tuple, np.dtype]], tensors: Iterator
):
    """Write a safetensors file: header from `entries` (name, shape, dtype), data from `tensors`."""
    header, offset = {}, 0
    for name, shape, dt in entries:
        n = int(math.prod(shape)) * dt.itemsize
        header[name] = {
            "dtype": _ST_DTYPES[dt.name],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(file, "wb") as fh:
        fh.write(len(hb).to_bytes(8, "little"))
        fh.write(hb)
        for (name, shape, dt), (tname, arr) in zip(entries, tensors):
            if tname != name or tuple(arr.shape) != tuple(shape) or arr.dtype != dt:
                raise RuntimeError(
                    f"export stream out of order at {name}: got {tname} {arr.shape} {arr.dtype}"
                )
            fh.write(np.ascontiguousarray(arr).tobytes())


def save_hf(
    model: Qwen3ForCausalLM,
    path,
    *,
    dtype=None,
    max_shard_bytes: int = 2 * 1024**3,
    tokenizer_from=None,
) -> Path:
    """Write an HF directory (config.json, safetensors shard(s) + index) for transformers/vLLM in
    `dtype` (default: the parameter dtype), with tokenizer files from `tokenizer_from` or the
    model's source directory. Multi-host: every process gathers, process 0 writes."""
    path = Path(path)
    write = jax.process_index() == 0
    if write:
        path.mkdir(parents=True, exist_ok=True)
    npdt = _np_dtype(dtype) or _np_dtype(model.param_dtype)
    shapes = hf_param_shapes(model.config)
    shards: list[list[tuple[str, tuple, np.dtype]]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = int(math.prod(shape)) * npdt.itemsize
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, npdt))
        size += n
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    stream = iter_hf_tensors(model, dtype=npdt)
    for fname, entries in zip(names, shards):
        if write:
            _write_safetensors_stream(path / fname, entries, stream)
        else:
            for _ in entries:
                next(stream)
    if not write:
        return path
    if len(shards) > 1:
        total = sum(int(math.prod(s)) * npdt.itemsize for s in shapes.values())
        wm = {name: fname for fname, entries in zip(names, shards) for name, _, _ in entries}
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": wm}, indent=2)
        )
    cfg = model.config.to_hf_dict()
    cfg["dtype"] = npdt.name
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    src = tokenizer_from if tokenizer_from is not None else model.hf_source
    if src is not None:
        for f in TOKENIZER_FILES:
            s = Path(src) / f
            if s.exists() and s.resolve() != (path / f).resolve():
                shutil.copyfile(s, path / f)
    return path
