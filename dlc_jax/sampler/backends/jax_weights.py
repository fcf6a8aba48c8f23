"""The JAX backend's in-memory, tensor-by-tensor weight load (`SamplerBackend.begin_load`).

Each verified HF tensor of a push is converted as it arrives (numerics knobs, HF -> our layout,
the parameter dtype) and placed on the device while the next tensor is still being received; a
stacked (scanned) parameter is filled layer by layer in one host buffer and placed when its last
layer is in. `state()` then builds the new params state; nothing serves it until the backend
swaps it in (`JaxBackend.apply_load`), so the old weights keep serving meanwhile and a failed push
changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dlc_jax.model.hf_io import _param_slots, _to_ours


class JaxWeightLoad:
    """One push into a copy of `state`'s structure. `transform(name, hf_array) -> fp32 array`: the
    backend's numerics knobs (None: none)."""

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
        self._stacks: dict[tuple, tuple[np.ndarray, set[int]]] = {}

    def add(self, name: str, array: np.ndarray) -> None:
        import jax.numpy as jnp

        if name not in self._slots:
            raise KeyError(f"tensor {name!r} is not a parameter of the served model")
        path, layer = self._slots[name]
        var = self._vars[path]
        dtype = np.dtype(var.dtype)
        shape = tuple(var.shape) if layer is None else tuple(var.shape[1:])
        hf = self._transform(name, array) if self._transform is not None else array
        ours = np.asarray(_to_ours(hf, path, shape)).astype(dtype)  # always a copy (owned)
        if layer is None:
            self._values[path] = jnp.asarray(ours)
            return
        if path not in self._stacks:
            self._stacks[path] = (np.empty(tuple(var.shape), dtype), set(range(var.shape[0])))
        buf, left = self._stacks[path]
        buf[layer] = ours
        left.discard(layer)
        if not left:
            self._values[path] = jnp.asarray(self._stacks.pop(path)[0])

    def state(self):
        """The new state: every parameter replaced; KeyError naming one the push did not give."""
        from flax import nnx

        out = []
        for path, var in self._flat:
            if isinstance(var, nnx.Param):
                if path not in self._values:
                    raise KeyError(f"parameter {'.'.join(map(str, path))} was not loaded")
                var = var.replace(self._values[path])
            out.append((path, var))
        return nnx.from_flat_state(out)
