"""LoRA adapters on the NNX module tree, found by parameter path.

Every target projection (a ``kernel`` contracting the input's last ``n_in`` axes) gets a ``lora``
child, ``y = x . W + scale * (x . A) . B``: float32 A [*in, r] uniform(+-1/sqrt(fan_in)), B
[r, *out] zero (a leading [L] axis when scanned; PEFT's lora_A / lora_B are their transposes).
Not qwix, whose adapters are named after traced call sites rather than the projection's path."""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dlc_jax.lora.config import NEVER_TARGETS, LoraConfig


class LoraParam(nnx.Param):
    """A LoRA factor (A or B): under LoRA the only trainable parameters."""


class LoraAdapter(nnx.Module):
    """``x [..., *in] -> scale * (x . A) . B  [..., *out]`` in the projection's compute dtype."""

    def __init__(self, a, b, *, scale: float, n_in: int, compute_dtype, logical_a, logical_b):
        self.a = LoraParam(a, out_sharding=tuple(logical_a), eager_sharding=False)
        self.b = LoraParam(b, out_sharding=tuple(logical_b), eager_sharding=False)
        self.scale = float(scale)
        self.n_in = int(n_in)
        self.compute_dtype = compute_dtype

    def __call__(self, x):
        cd = self.compute_dtype
        rate = getattr(self, "dropout", 0.0)  # set on the training forward only (lora.dropout)
        if rate:
            x = drop(x, self.drop_key.get_value(), rate)
        h = jnp.tensordot(x.astype(cd), self.a.get_value().astype(cd), axes=self.n_in)
        return self.scale * jnp.tensordot(h, self.b.get_value().astype(cd), axes=1)


def drop(x, key_data, rate: float):
    """Inverted dropout of ``x`` at ``rate`` (``lora.dropout``)."""
    keep = jax.random.bernoulli(jax.random.wrap_key_data(key_data), 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


def module_path(path: Sequence) -> str:
    return ".".join(str(p) for p in path)


def _matches(path: str, patterns: Sequence[str]) -> bool:
    last = path.rsplit(".", 1)[-1]
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(last, p) for p in patterns)


def _projections(model) -> list[tuple[str, Any]]:
    """(dotted path, module) of every module with a ``kernel`` Param and an ``n_in``."""
    return [
        (module_path(path), m)
        for path, m in nnx.iter_modules(model)
        if isinstance(getattr(m, "kernel", None), nnx.Param) and hasattr(m, "n_in")
    ]


def find_targets(model, patterns: Sequence[str]) -> list[tuple[str, Any]]:
    """The projections whose path matches ``patterns``; a pattern matching none is an error."""
    projs = _projections(model)
    for p in patterns:
        if not any(_matches(path, [p]) for path, _ in projs):
            names = sorted({path.rsplit(".", 1)[-1] for path, _ in projs})
            raise ValueError(f"lora.targets: {p!r} matches no projection (names: {names})")
    chosen = [(path, m) for path, m in projs if _matches(path, patterns)]
    for path, _ in chosen:
        if any(n in path for n in NEVER_TARGETS):
            raise ValueError(f"lora.targets: {path} is never adapted")
    return chosen


def _placed(value, kernel_value, logical):
    """``value`` placed by its logical axes on the kernel's mesh (as it is off a mesh)."""
    sharding = getattr(kernel_value, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not getattr(mesh, "shape", None):
        return value
    from dlc_jax.model.sharding import named_sharding

    return jax.device_put(value, named_sharding(logical, value.shape, mesh))


def apply_lora(model, cfg: LoraConfig) -> list[str]:
    """Give every target projection of ``model`` a ``lora`` adapter (in place; A drawn from
    ``cfg.seed`` per path; ShapeDtypeStructs on an abstract model); returns their paths."""
    if not cfg.enabled:
        return []
    from dlc_jax.model.sharding import param_logical_axes

    paths = []
    for path, m in find_targets(model, cfg.patterns):
        if getattr(m, "lora", None) is not None:
            raise ValueError(f"lora: {path} already has an adapter")
        kv = m.kernel.get_value()
        logical = param_logical_axes(m.kernel) or (None,) * kv.ndim
        stacked = len(logical) > 0 and logical[0] == "layers"
        lead = kv.shape[:1] if stacked else ()
        lead_ax = ("layers",) if stacked else ()
        body = logical[len(lead) :]
        in_shape = kv.shape[len(lead) : len(lead) + m.n_in]
        out_shape = kv.shape[len(lead) + m.n_in :]
        seed = int.from_bytes(hashlib.sha256(f"{cfg.seed}:{path}".encode()).digest()[:4], "little")
        bound = 1.0 / np.sqrt(np.prod(in_shape))  # fan_in
        a_shape, b_shape = lead + in_shape + (cfg.rank,), lead + (cfg.rank,) + out_shape
        la = lead_ax + tuple(body[: m.n_in]) + (None,)
        lb = lead_ax + (None,) + tuple(body[m.n_in :])
        if isinstance(kv, jax.ShapeDtypeStruct):
            a: Any = jax.ShapeDtypeStruct(a_shape, jnp.float32)
            b: Any = jax.ShapeDtypeStruct(b_shape, jnp.float32)
        else:
            a = jax.random.uniform(jax.random.key(seed), a_shape, jnp.float32, -bound, bound)
            a, b = _placed(a, kv, la), _placed(jnp.zeros(b_shape, jnp.float32), kv, lb)
        cd, n_in = m.compute_dtype, m.n_in
        m.lora = LoraAdapter(
            a, b, scale=cfg.scale, n_in=n_in, compute_dtype=cd, logical_a=la, logical_b=lb
        )
        paths.append(path)
    return paths


def adapted(model) -> list[tuple[str, Any]]:
    """(path, projection) of every projection of ``model`` that carries an adapter."""
    return [(p, m) for p, m in _projections(model) if getattr(m, "lora", None) is not None]


@jax.jit
def _delta(a, b, scale):
    """scale * A . B in float32: [*in, r] x [r, *out] -> [*in, *out]."""
    return scale * jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)


def lora_delta(adapter: LoraAdapter, stacked: bool):
    """The adapter's weight delta in its kernel's layout (float32)."""
    a, b = adapter.a.get_value(), adapter.b.get_value()
    scale = jnp.float32(adapter.scale)
    if stacked:
        return jax.vmap(_delta, in_axes=(0, 0, None))(a, b, scale)
    return _delta(a, b, scale)


@jax.jit
def _merge(kernel, delta):
    return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)


def merged_model(model):
    """A copy with ``W + scale * A . B`` in every adapted kernel and no adapters."""
    out = nnx.merge(*nnx.split(model))
    for _, m in adapted(out):
        stacked = m.lora.a.get_value().ndim == m.n_in + 2  # A [L, *in, r] vs [*in, r]
        # a new Variable: the merged module shares its Variables with ``model``
        m.kernel = m.kernel.replace(_merge(m.kernel.get_value(), lora_delta(m.lora, stacked)))
        del m.lora
    return out


def adapter_parameter_count(model) -> int:
    """Number of LoRA parameters in ``model``."""
    state = nnx.state(model, LoraParam)
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))


def trainable_filter(cfg: LoraConfig):
    """The NNX filter of the trainable parameters: ``LoraParam`` under LoRA, else None (all)."""
    return LoraParam if cfg.enabled else None
