"""Export of a LoRA run: the adapters in the PEFT layout (``adapter_config.json`` +
``adapter_model.safetensors``, loadable by transformers/peft and vLLM's LoRA loader), or the merged
HF model.

PEFT names and layouts, per adapted projection ``P`` (HF name ``model.layers.i.self_attn.q_proj``):

    base_model.model.P.lora_A.weight   [r, in_features]    = A (in dims flattened) transposed
    base_model.model.P.lora_B.weight   [out_features, r]   = B (out dims flattened) transposed

with ``lora_alpha`` / ``r`` giving the same scale. Flattening our ``[*in]`` / ``[*out]`` dims in
row-major order is the layout HF's ``[out_features, in_features]`` kernels use (see
``dlc_jax.model.hf_io``), so ``W_hf + scale * B_peft @ A_peft`` is the merged HF weight.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np

from dlc_jax.lora.adapters import adapted
from dlc_jax.lora.config import LoraConfig
from dlc_jax.sampler.push.adapter import PEFT_PREFIX, peft_adapter_config


def _layers(path: str, stacked: bool, n: int) -> list[tuple[str, int | None]]:
    """(HF module name, layer index into the stacked factor or None) of an adapted module path."""
    if not stacked:
        return [(path, None)]
    head, tail = path.split("model.layers.", 1)
    return [(f"{head}model.layers.{i}.{tail}", i) for i in range(n)]


def host_factors(values: list) -> list[np.ndarray]:
    """``values`` (device arrays) as float32 host arrays, each whole. In a multi-host run, where a
    factor may be sharded over other processes' devices, one all-gather of them all (a
    collective: every process must call it, with the same factors)."""
    if all(getattr(v, "is_fully_addressable", True) for v in values):
        return [np.asarray(x, np.float32) for x in jax.device_get(values)]
    from jax.experimental import multihost_utils

    return [
        np.asarray(x, np.float32) for x in multihost_utils.process_allgather(values, tiled=True)
    ]


def peft_tensors(model) -> Iterator[tuple[str, np.ndarray]]:
    """(PEFT name, float32 array) of every adapter factor of ``model``, gathered to host (in a
    multi-host run a collective: `host_factors`)."""
    mods = adapted(model)
    vals = host_factors([x for _, m in mods for x in (m.lora.a.get_value(), m.lora.b.get_value())])
    for k, (path, m) in enumerate(mods):
        a, b = vals[2 * k], vals[2 * k + 1]
        stacked = a.ndim == m.n_in + 2
        for name, i in _layers(path, stacked, a.shape[0] if stacked else 1):
            ai, bi = (a, b) if i is None else (a[i], b[i])
            r = ai.shape[-1]
            yield f"{PEFT_PREFIX}{name}.lora_A.weight", np.ascontiguousarray(ai.reshape(-1, r).T)
            yield f"{PEFT_PREFIX}{name}.lora_B.weight", np.ascontiguousarray(bi.reshape(r, -1).T)


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


def export_lora_checkpoint(
    ckpt_dir,
    out_dir,
    meta: dict,
    model_dir: Path,
    *,
    dtype,
    fmt: str = "merged",
    max_shard_bytes: int = 2 * 1024**3,
) -> Path:
    """Write a LoRA checkpoint (adapters only, see ``dlc_jax.lora.base_check``) as the merged HF
    model (``fmt='merged'``) or as a PEFT adapter directory (``fmt='adapter'``). The base is
    ``model_dir`` loaded as the run loaded it, refused unless its fingerprint is the
    checkpoint's."""
    from flax import nnx

    from dlc_jax.lora.adapters import LoraParam, apply_lora, merged_model
    from dlc_jax.lora.base_check import META_KEY, base_fingerprint
    from dlc_jax.model import load_hf, save_hf
    from dlc_jax.trainer.config import TrainConfig, from_dict
    from dlc_jax.trainer.export_cli import restore_params

    if fmt not in ("merged", "adapter"):
        raise ValueError(f"--lora: {fmt!r} is not one of ['merged', 'adapter']")
    cfg = from_dict(TrainConfig, meta["config"])
    import jax.numpy as jnp

    pdt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[cfg.model.param_dtype]
    model = load_hf(str(model_dir), param_dtype=pdt, scan_layers=cfg.model.scan_layers)
    apply_lora(model, cfg.lora)
    fp = base_fingerprint(nnx.state(model, nnx.Param))
    if fp != meta.get(META_KEY):
        raise ValueError(
            f"{model_dir} is not the base these adapters were trained on (fingerprint {fp}, "
            f"checkpoint {meta.get(META_KEY)}); pass the run's base with --model"
        )
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev),
        nnx.state(model, LoraParam),
    )
    _, restored = restore_params(ckpt_dir, int(meta["step"]), abstract)
    nnx.update(model, restored)
    if fmt == "adapter":
        return save_peft(model, cfg.lora, out_dir, base=str(model_dir))
    merged = merged_model(model)
    merged.hf_source = str(model_dir)
    return Path(save_hf(merged, out_dir, dtype=dtype, max_shard_bytes=max_shard_bytes))
