"""The frozen base's fingerprint: LoRA checkpoints hold adapters only, so they record which base
they adapt and a resume onto another base refuses (one line naming both)."""

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
    """A short hash of the frozen base (every non-LoRA parameter: path, shape, dtype and two
    32-bit sums of its bits, computed on device)."""
    base = nnx.split_state(params, LoraParam, ...)[1] if _has_lora(params) else params
    flat = {module_path(p): v.get_value() for p, v in nnx.to_flat_state(base)}
    names = sorted(flat)
    sums, _ = array_checksums([flat[k] for k in names])
    h = hashlib.sha256()
    for k, s in zip(names, sums.values(), strict=True):
        h.update(f"{k}:{tuple(flat[k].shape)}:{flat[k].dtype}:{s}".encode())
    return h.hexdigest()[:16]


def _has_lora(params) -> bool:
    return any(isinstance(v, LoraParam) for _, v in nnx.to_flat_state(params))


def base_meta(fingerprint: str | None) -> dict:
    """The checkpoint metadata entry of a LoRA run (nothing for full fine-tuning)."""
    return {} if fingerprint is None else {META_KEY: fingerprint}


def check_base(meta: dict, fingerprint: str | None, where: str) -> None:
    """Refuse a checkpoint whose adapters were trained on another base (or a full-FT checkpoint
    for a LoRA run and vice versa)."""
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
