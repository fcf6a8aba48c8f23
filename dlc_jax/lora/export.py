"""A LoRA run's adapters in the PEFT layout (loadable by peft and vLLM): per projection ``P``,
``base_model.model.P.lora_A.weight`` [r, in] = A^T and ``lora_B`` [out, r] = B^T."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np

from dlc_jax.lora.adapters import adapted
from dlc_jax.lora.config import LoraConfig
from dlc_jax.sampler.push.adapter import peft_adapter_config, peft_name


def _layers(path: str, stacked: bool, n: int) -> list[tuple[str, int | None]]:
    """(HF module name, layer index into the stacked factor or None) of an adapted module path."""
    if not stacked:
        return [(path, None)]
    head, tail = path.split("model.layers.", 1)
    return [(f"{head}model.layers.{i}.{tail}", i) for i in range(n)]


def host_factors(values: list) -> list[np.ndarray]:
    """Device arrays as whole float32 host arrays (one all-gather when needed)."""
    if all(getattr(v, "is_fully_addressable", True) for v in values):
        host = jax.device_get(values)
    else:
        from jax.experimental import multihost_utils

        host = multihost_utils.process_allgather(values, tiled=True)
    return [np.asarray(x, np.float32) for x in host]


def peft_tensors(model) -> Iterator[tuple[str, np.ndarray]]:
    """(PEFT name, float32 array) of every adapter factor (multi-host: a collective)."""
    mods = adapted(model)
    vals = host_factors([x for _, m in mods for x in (m.lora.a.get_value(), m.lora.b.get_value())])
    for k, (path, m) in enumerate(mods):
        a, b = vals[2 * k], vals[2 * k + 1]
        stacked = a.ndim == m.n_in + 2
        for name, i in _layers(path, stacked, a.shape[0] if stacked else 1):
            ai, bi = (a, b) if i is None else (a[i], b[i])
            r = ai.shape[-1]
            yield peft_name(name, "lora_A"), np.ascontiguousarray(ai.reshape(-1, r).T)
            yield peft_name(name, "lora_B"), np.ascontiguousarray(bi.reshape(r, -1).T)


def adapter_config(cfg: LoraConfig, model, base: str) -> dict:
    """PEFT's ``adapter_config.json`` for ``model``'s adapters."""
    names = sorted({p.rsplit(".", 1)[-1] for p, _ in adapted(model)})
    return peft_adapter_config(cfg.rank, cfg.alpha, names, base=base)


def save_peft(model, cfg: LoraConfig, out_dir, *, base: str = "") -> Path:
    """Write ``model``'s adapters as a PEFT LoRA directory; returns it."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = dict(peft_tensors(model))
    if not tensors:
        raise ValueError("the model has no LoRA adapters to export")
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(
        json.dumps(adapter_config(cfg, model, base), indent=2) + "\n"
    )
    return out


def adapter_bytes(model) -> int:
    """Bytes of the adapters as exported (float32)."""
    return int(sum(x.nbytes for _, x in peft_tensors(model)))
