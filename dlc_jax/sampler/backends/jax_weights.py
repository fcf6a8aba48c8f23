"""The JAX backend's tensor-by-tensor weight load (`SamplerBackend.begin_load`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from dlc_jax.model.hf_io import _param_slots, _to_ours


@functools.lru_cache(maxsize=256)
def _converter(kernel: bool, shape: tuple, dtype: np.dtype):
    """jit(HF tensor -> ours): cast to the parameter dtype; kernels transposed and reshaped (as
    `hf_io._to_ours`). The output is a fresh device buffer (the input view may be released)."""
    import jax

    def convert(x):
        x = x.astype(dtype)
        return x.T.reshape(shape) if kernel else x.reshape(shape)

    return jax.jit(convert)


@functools.lru_cache(maxsize=256)
def _merger(shape: tuple, dtype: np.dtype):
    """jit(our kernel W, A^T [in, r], B^T [r, out], scale -> W + scale * A^T.B^T): a LoRA merge in
    our layout (HF's transposed and reshaped, so ``(B @ A).T`` is ``A^T @ B^T``), float32 math."""
    import jax
    import jax.numpy as jnp

    def merge(w, at, bt, scale):
        delta = (at @ bt).reshape(shape)
        return (w.astype(jnp.float32) + scale * delta).astype(dtype)

    return jax.jit(merge)


def _stack(pieces: dict[tuple, Any], lead: tuple[int, ...], prefix: tuple = ()):
    """The [*lead, ...] array of `pieces` (leading index tuple -> slice): stacked layers, stacked
    experts, or both (scanned mixture-of-experts weights [L, E, ...])."""
    import jax.numpy as jnp

    if len(prefix) == len(lead):
        return pieces[prefix]
    return jnp.stack([_stack(pieces, lead, (*prefix, i)) for i in range(lead[len(prefix)])])


class JaxWeightLoad:
    """One push into a copy of `state`'s structure; `transform(name, hf_array)`: numerics knobs."""

    def __init__(
        self,
        state,
        num_layers: int,
        transform: Callable[[str, np.ndarray], np.ndarray] | None = None,
    ):
        from flax import nnx

        self._flat = list(nnx.to_flat_state(state))
        self._vars = dict(self._flat)
        self._slots = _param_slots(state, num_layers)
        self._transform = transform
        self._values: dict[tuple, object] = {}
        self._stacks: dict[tuple, tuple[dict[tuple, Any], set[tuple]]] = {}

    def add(self, name: str, array: np.ndarray) -> None:
        import jax.numpy as jnp

        if name not in self._slots:
            raise KeyError(f"tensor {name!r} is not a parameter of the served model")
        path, idx = self._slots[name]  # idx: () one tensor; (layer,), (expert,), (layer, expert)
        var = self._vars[path]
        dtype = np.dtype(var.dtype)
        shape = tuple(var.shape[len(idx) :])
        if self._transform is not None:  # numerics knobs: fp32 numpy math in HF layout
            # a private host copy: a device array made from a staging view (1-D tensors pass the
            # transform) may read it after the next push overwrote it (NaNs in a norm weight)
            host = np.array(_to_ours(self._transform(name, array), path, shape), dtype, copy=True)
            ours = jnp.asarray(host)
        else:  # cast + HF -> our layout on the device (XLA: ~6x less CPU than numpy for bf16)
            ours = _converter(path[-1] == "kernel", shape, dtype)(array)
        # XLA may read a 64-byte-aligned staging view in place: done before the view goes
        ours.block_until_ready()
        self._put(path, idx, ours)

    def add_lora(self, name: str, a: np.ndarray, b: np.ndarray, scale: float) -> None:
        """The HF kernel ``name`` as ``W + scale * b @ a`` (PEFT A [r, in], B [out, r]), merged on
        the device into the starting state (not with knobs)."""
        import jax.numpy as jnp

        if self._transform is not None:
            raise ValueError("add_lora: the numerics knobs transform HF tensors: use add()")
        if name not in self._slots:
            raise KeyError(f"tensor {name!r} is not a parameter of the served model")
        path, idx = self._slots[name]
        if path[-1] != "kernel":
            raise KeyError(f"tensor {name!r} is not a projection kernel")
        var = self._vars[path]
        w = var.get_value()
        w = w[idx] if idx else w
        merge = _merger(tuple(w.shape), np.dtype(var.dtype))
        self._put(path, idx, merge(w, jnp.asarray(a.T), jnp.asarray(b.T), jnp.float32(scale)))

    def _put(self, path: tuple, idx: tuple, ours) -> None:
        """Store ``ours`` (or piece ``idx`` of a stacked parameter, stacked once complete)."""
        var = self._vars[path]
        if not idx:
            self._values[path] = ours
            return
        lead = tuple(var.shape[: len(idx)])
        if path not in self._stacks:
            self._stacks[path] = ({}, set(np.ndindex(*lead)))
        pieces, left = self._stacks[path]
        pieces[idx] = ours
        left.discard(idx)
        if not left:
            self._values[path] = _stack(pieces, lead)
            del self._stacks[path]

    def state(self, partial: bool = False):
        """The new state (KeyError naming a parameter not given, unless ``partial``)."""
        from flax import nnx

        if partial:
            for path, (pieces, left) in list(self._stacks.items()):
                base = self._vars[path].get_value()
                for idx in left:
                    pieces[idx] = base[idx]
                self._values[path] = _stack(pieces, tuple(base.shape[: len(next(iter(left)))]))
                del self._stacks[path]
        out = []
        for path, var in self._flat:
            if isinstance(var, nnx.Param):
                if path in self._values:
                    var = var.replace(self._values[path])
                elif not partial:
                    raise KeyError(f"parameter {'.'.join(map(str, path))} was not loaded")
            out.append((path, var))
        return nnx.from_flat_state(out)
