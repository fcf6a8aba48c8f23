"""HF checkpoint <-> NNX models of the registered families (`registry.py`), streaming one tensor
at a time.

Here: the HF names and shapes of a model's parameters, the two layouts' conversion, and the save:
gather one parameter at a time and stream it into safetensors shards whose headers are planned up
front from the shapes (host memory ~ one tensor). Load: `hf_load.load_hf`.
"""

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
    """HF tensor name -> HF shape, in checkpoint order (no lm_head.weight when tied), from the
    config's model family (`registry.py`)."""
    return family_of(config).hf_param_shapes(config)


def _hf_name(path: tuple) -> str:
    parts = [str(p) for p in path]
    if parts[-1] == "kernel":
        parts[-1] = "weight"
    return ".".join(parts)


def _param_slots(state, num_layers: int) -> dict[str, tuple[tuple, tuple[int, ...]]]:
    """HF name -> (nnx state path, leading indices) for every Param in `state`. The indices are ()
    for a parameter that is one HF tensor; stacked (scanned) layer parameters [L, ...] map each HF
    layer tensor to (path, (i,)); mixture-of-experts weights stacked on the expert axis
    (`...mlp.experts.gate_proj.kernel` [E, ...], or [L, E, ...] scanned) map HF's per-expert
    tensors `...mlp.experts.{e}.gate_proj.weight` to (path, (e,)) / (path, (i, e))."""
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
    if path[-1] == "kernel":
        return np.ascontiguousarray(hf.T).reshape(our_shape)
    return hf


def _gather(x: jax.Array) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _np_dtype(dtype):
    if dtype is None:
        return None
    return np.dtype(jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnames=("hf_shape", "kernel", "transpose", "dtype"))
def _to_hf_on_device(
    x: jax.Array, idx, *, hf_shape: tuple, kernel: bool, transpose: bool = True, dtype
) -> jax.Array:
    """HF layout and export dtype computed where the parameter lives, so the device->host copy moves
    the export bytes (half of fp32 for bf16). `idx`: a tuple of leading indices into a stacked
    parameter ([L, ...] layers, [E, ...] experts, [L, E, ...]), () for none. A kernel comes back
    as [out, in] (HF) with `transpose`, else as [in, out] (our layout flattened to 2-D) for the
    host to transpose (`_host_transpose`)."""
    for i in idx:
        x = jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
    if kernel:
        x = x.reshape(hf_shape[::-1])
        if transpose:
            x = x.T
    return x if dtype is None else x.astype(dtype)


def _as_uint(a: np.ndarray) -> np.ndarray:
    """`a` viewed as unsigned ints of its item width (plain numpy copy loops, which release the
    GIL; ml_dtypes' bfloat16 copies do not), else `a` itself."""
    if a.dtype.itemsize in (1, 2, 4, 8):
        return a.view(np.dtype(f"u{a.dtype.itemsize}"))
    return a


def _host_transpose(a: np.ndarray, block_rows: int = 64) -> np.ndarray:
    """`a.T` (2-D) as a new C-contiguous array, copied `block_rows` source rows at a time: the
    block's source and destination stay in cache, 3-5x less CPU than `np.ascontiguousarray(a.T)`
    and than XLA:CPU's transpose for MB-sized matrices. Bytes are moved as is (bit-identical)."""
    rows, cols = a.shape
    out = np.empty((cols, rows), a.dtype)
    src, dst = _as_uint(a), _as_uint(out)
    for i in range(0, rows, block_rows):
        dst[:, i : i + block_rows] = src[i : i + block_rows].T
    return out


def _on_cpu(x: jax.Array) -> bool:
    return all(d.platform == "cpu" for d in x.devices())


def hf_device_tensors(
    model: Qwen3ForCausalLM, *, dtype=np.float32, host_transpose: bool | None = None
) -> Iterator[tuple[str, jax.Array, bool]]:
    """Yield (HF name, device array, on_host) one tensor at a time, in `hf_param_shapes` order: the
    layer slice and the cast run where the parameter lives (keeping its sharding); kernels are
    transposed to HF [out, in] there too unless `on_host` (then the caller transposes after the
    gather; `host_transpose` None = when the parameter lives on CPU devices, where XLA's transpose
    costs 3-5x the host's blocked copy). `dtype=None` keeps the parameter dtype. The next tensor's
    device work is dispatched before this one is yielded (JAX dispatch is asynchronous: it runs
    while the caller copies this one out). Same order everywhere (multi-host: every process
    converts the same tensors in the same order)."""
    params = nnx.state(model, nnx.Param)
    flat = dict(nnx.to_flat_state(params))
    slots = _param_slots(params, model.config.num_hidden_layers)
    npdt = _np_dtype(dtype)

    def dispatch(name: str, hf_shape: tuple) -> tuple[str, jax.Array, bool]:
        p, idx = slots[name]
        value = flat[p].get_value()
        kernel = p[-1] == "kernel"
        on_host = kernel and (_on_cpu(value) if host_transpose is None else host_transpose)
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
    """Yield (HF name, HF-layout numpy array) one tensor at a time, gathered to host: the tensors
    of `hf_device_tensors` (same arguments), transposed on host where it says so. Tied models
    yield no lm_head.weight; the bytes are the same whichever side transposes."""
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
    """Write a safetensors file whose header is built from `entries` (name, shape, dtype); the data
    comes one array at a time from `tensors` (same order)."""
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
    """Write an HF directory (config.json, safetensors shard(s) + index) loadable by transformers,
    vLLM. `dtype` (e.g. jnp.bfloat16; default: the parameter dtype). Tokenizer files are copied from
    `tokenizer_from`, else from the directory the model was loaded from (if any). Multi-host: every
    process gathers, process 0 writes."""
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
