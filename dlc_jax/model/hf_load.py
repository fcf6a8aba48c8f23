"""Load an HF checkpoint into a registered family's NNX model one tensor at a time: build it
abstractly, then read each tensor, convert it to our layout and place it straight onto its
NamedSharding (each device receives only its slice). Names, layouts and saving: `hf_io.py`."""

from __future__ import annotations

import collections
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from .abstract import abstract_model
from .hf_io import _IGNORED_SUFFIXES, CheckpointError, _param_slots, _to_ours, hf_param_shapes
from .qwen3 import Qwen3ForCausalLM
from .registry import config_from_pretrained
from .sharding import named_sharding, param_logical_axes


def _checkpoint_index(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file (from model.safetensors.index.json, else the files)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        wm = json.loads(index.read_text())["weight_map"]
        return {k: path / v for k, v in wm.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    from safetensors import safe_open

    out = {}
    for f in files:
        with safe_open(str(f), framework="numpy") as h:
            out.update(dict.fromkeys(h.keys(), f))
    return out


def _read_tensor(file: Path, name: str) -> np.ndarray:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="numpy") as h:
            return h.get_tensor(name)
    except TypeError:  # bf16 has no numpy dtype in some safetensors versions: go through flax
        with safe_open(str(file), framework="flax") as h:
            return np.asarray(h.get_tensor(name).astype(jnp.float32))


def _place(arr: np.ndarray, sharding) -> jax.Array:
    if sharding is None:
        return jnp.asarray(arr)
    return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def _layer_sharding(sharding, n: int = 1):
    """Sharding of one slice of a stacked parameter (stacked spec minus its first `n` axes)."""
    if sharding is None:
        return None
    return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[n:]))


@functools.lru_cache(maxsize=256)
def _stacked_zeros(shape: tuple, dtype, sharding):
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


@functools.lru_cache(maxsize=256)
def _layer_writer(sharding):
    """jit(stacked, piece, idx) -> stacked with [*idx] = piece, stacked donated (in place)."""

    def write(stacked, piece, idx):
        if len(idx) == 1:
            return jax.lax.dynamic_update_index_in_dim(stacked, piece, idx[0], 0)
        piece = piece.reshape((1,) * len(idx) + piece.shape)
        zeros = (jnp.int32(0),) * (stacked.ndim - len(idx))
        return jax.lax.dynamic_update_slice(stacked, piece, (*idx, *zeros))

    return jax.jit(write, donate_argnums=(0,), out_shardings=sharding)


def load_hf(
    path,
    *,
    mesh=None,
    param_dtype=jnp.float32,
    compute_dtype=jnp.float32,
    rules=None,
    remat: bool | str | None = None,
    scan_layers: bool | None = None,
    attention_impl: str | None = None,
    moe_impl: str | None = None,
    moe_dispatch: str | None = None,
) -> Qwen3ForCausalLM:
    """Load an HF directory into its family's model one tensor at a time; with `mesh`, straight onto
    NamedShardings (stacked parameters allocated once, written in place), activation constraints on.
    Run options override the config's unless None; `remat` as in `Qwen3ForCausalLM`. Raises
    `CheckpointError` naming a missing, misshaped or unexpected tensor; `UnsupportedModelError`."""
    path = Path(path)
    options = dict(scan_layers=scan_layers, attention_impl=attention_impl)
    options.update(moe_impl=moe_impl, moe_dispatch=moe_dispatch)  # mixture-of-experts families
    config = config_from_pretrained(path, **{k: v for k, v in options.items() if v is not None})
    dtypes = dict(param_dtype=param_dtype, compute_dtype=compute_dtype)
    abstract = abstract_model(config, mesh=mesh, rules=rules, remat=remat, **dtypes)
    graphdef, params, *rest = nnx.split(abstract, nnx.Param, ...)  # rest: [non-Param state]
    index = _checkpoint_index(path)
    expected = hf_param_shapes(config)
    slots = _param_slots(params, config.num_hidden_layers)
    assert set(slots) == set(expected), sorted(set(slots) ^ set(expected))
    missing = [n for n in expected if n not in index]
    if missing:
        raise CheckpointError(f"checkpoint {path} is missing tensor(s) {missing[:8]}")
    unexpected = [
        n
        for n in index
        if n not in expected
        and not n.endswith(_IGNORED_SUFFIXES)
        and not (n == "lm_head.weight" and config.tie_word_embeddings)
    ]
    if unexpected:
        raise CheckpointError(f"checkpoint {path} has unexpected tensor(s) {unexpected[:8]}")

    flat = dict(nnx.to_flat_state(params))
    stacked: dict[tuple, jax.Array] = {}
    pieces_left = collections.Counter(p for p, idx in slots.values() if idx)
    for name, hf_shape in expected.items():
        p, idx = slots[name]
        var = flat[p]
        hf = _read_tensor(index[name], name)
        if tuple(hf.shape) != tuple(hf_shape):
            raise CheckpointError(
                f"tensor {name} in {index[name].name} has shape {tuple(hf.shape)}, "
                f"expected {tuple(hf_shape)}"
            )
        shape = var.shape[len(idx) :]
        ours = _to_ours(hf, p, shape).astype(param_dtype)
        axes = param_logical_axes(var) or (None,) * len(var.shape)
        sharding = None if mesh is None else named_sharding(axes, var.shape, mesh, rules)
        if not idx:
            var.set_value(_place(ours, sharding))
        else:
            if p not in stacked:
                stacked[p] = _stacked_zeros(tuple(var.shape), jnp.dtype(param_dtype), sharding)()
            piece = _place(ours, _layer_sharding(sharding, len(idx)))
            at = tuple(jnp.int32(i) for i in idx)
            stacked[p] = _layer_writer(sharding)(stacked[p], piece, at)
            pieces_left[p] -= 1
            if not pieces_left[p]:
                var.set_value(stacked.pop(p))
        del hf, ours
    model = nnx.merge(graphdef, nnx.from_flat_state(flat), *rest)
    model.hf_source = str(path)
    return model
