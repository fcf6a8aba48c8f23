"""The frozen base's fingerprint: a LoRA checkpoint (adapters only) refuses to resume on another."""

from __future__ import annotations

import hashlib

from flax import nnx

from dlc_jax.errors import UserError
from dlc_jax.lora.adapters import LoraParam, module_path
from dlc_jax.model.checksums import array_checksums

META_KEY = "lora_base_fingerprint"


class BaseMismatchError(UserError):
    """A LoRA checkpoint restored onto another base model."""


def base_fingerprint(params) -> str:
    """A short hash of every non-LoRA parameter's path, shape, dtype and checksums."""
    has_lora = any(isinstance(v, LoraParam) for _, v in nnx.to_flat_state(params))
    base = nnx.split_state(params, LoraParam, ...)[1] if has_lora else params
    flat = {module_path(p): v.get_value() for p, v in nnx.to_flat_state(base)}
    names = sorted(flat)
    sums, _ = array_checksums([flat[k] for k in names])
    h = hashlib.sha256()
    for k, s in zip(names, sums.values(), strict=True):
        h.update(f"{k}:{tuple(flat[k].shape)}:{flat[k].dtype}:{s}".encode())
    return h.hexdigest()[:16]


def base_meta(fingerprint: str | None) -> dict:
    """The checkpoint metadata entry of a LoRA run (nothing for full fine-tuning)."""
    return {} if fingerprint is None else {META_KEY: fingerprint}


def check_base(meta: dict, fingerprint: str | None, where: str) -> None:
    """Refuse adapters trained on another base (or full fine-tuning for LoRA and vice versa)."""
    saved = meta.get(META_KEY)
    if saved == fingerprint:
        return
    if fingerprint is None:
        raise BaseMismatchError(f"{where}: a LoRA checkpoint (adapters only); set lora.rank")
    if saved is None:
        raise BaseMismatchError(f"{where}: a full fine-tuning checkpoint; lora.rank must be 0")
    raise BaseMismatchError(
        f"{where}: its adapters were trained on base {saved}, this run's base is {fingerprint} "
        f"(another model.path or SFT warm-up); start over with checkpoint.resume=false "
        f"checkpoint.overwrite=true"
    )
