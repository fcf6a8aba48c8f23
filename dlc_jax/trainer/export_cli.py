"""`dlc-jax export --checkpoint DIR [--step N] --out HF_DIR [--dtype bfloat16|float32] [--model
HF_DIR]`: turn an orbax training checkpoint's theta_t into an HF directory for serving.

Only `params` is restored and verified as a resume verifies it; the architecture and tokenizer
come from `--model` or the run's config. The output is written beside ``--out`` and renamed in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

from dlc_jax.cli_args import ArgumentParser
from dlc_jax.errors import UserError

_DTYPES = ("float32", "bfloat16")


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="dlc-jax export", description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--checkpoint", required=True, help="orbax checkpoint directory of a run (checkpoint.dir)")
    add("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    add("--out", required=True, help="output HF directory")
    add("--dtype", choices=_DTYPES, default="float32", help="dtype of the written tensors")
    add(
        "--model",
        default=None,
        help="HF directory of the run's initial model (config + tokenizer); "
        "default: from the checkpoint's config",
    )
    add("--max-shard-gb", type=float, default=2.0, help="largest safetensors shard (GiB)")
    add("--overwrite", action="store_true", help="replace a non-empty --out directory")
    add(
        "--lora",
        choices=("merged", "adapter"),
        default="merged",
        help="a LoRA run's checkpoint: the merged HF model, or the adapter alone (PEFT layout)",
    )
    return p


class ExportError(UserError):
    """An export refused: a bad argument, an unusable output directory, an unreadable checkpoint."""


def _jnp_dtype(name: str):
    import jax.numpy as jnp

    return getattr(jnp, name)


def _on_one_device(tree):
    """``tree``'s leaves as ShapeDtypeStructs on this process's first device (a restore target)."""
    import jax

    dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), tree)


def check_out_dir(out_dir, overwrite: bool) -> Path:
    """``out_dir`` as a Path, refused when a file or (without ``overwrite``) non-empty."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {str(out)!r} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"--out {str(out)!r} is not empty; pass --overwrite to replace it, or choose a new "
            "directory"
        )
    return out


def model_dir_from_meta(meta: dict) -> Path:
    """The run's initial HF directory named by the config saved in the checkpoint metadata."""
    from dlc_jax.trainer.config import ConfigError, TrainConfig, from_dict
    from dlc_jax.trainer.sft import sft_cache_dir, tiny_model_dir

    if "config" not in meta:
        raise ExportError("checkpoint metadata has no 'config'; pass --model HF_DIR")
    try:
        cfg = from_dict(TrainConfig, meta["config"])
    except ConfigError as e:
        raise ExportError(
            f"checkpoint metadata config is not readable ({e}); pass --model HF_DIR"
        ) from e
    d = sft_cache_dir(cfg) if cfg.sft.enabled else Path(cfg.model.path or tiny_model_dir(cfg))
    if not (d / "config.json").exists():
        raise ExportError(
            f"the run's model directory {str(d)!r} (from the checkpoint config) has no "
            "config.json; pass --model HF_DIR"
        )
    return d


def restore_params(ckpt_dir, meta: dict, abstract_params):
    """The `params` of checkpoint step ``meta["step"]`` onto `abstract_params`, verified."""
    import jax
    import orbax.checkpoint as ocp

    from dlc_jax.trainer.checkpoint import Checkpointer, CheckpointError, verify_tree

    step = int(meta["step"])
    with contextlib.closing(Checkpointer(ckpt_dir)) as ck:
        target = {"params": abstract_params}
        restore_args = jax.tree.map(
            lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype), target
        )
        item = ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
        out = ck.restore_items(step, "params unreadable or not matching the model", 300, state=item)
        params = out["state"]["params"]
        want = meta.get("checksums")
        if want is not None:  # the params' own sums (the checkpoint also holds optimizer state)
            want = {k: v for k, v in want.items() if k.startswith("['params']")}
        try:
            verify_tree({"params": params}, {"checksums": want} if want is not None else {})
        except ValueError as e:
            raise CheckpointError(
                f"checkpoint {ck.directory}/{step}: corrupt, not exported: {e}"
            ) from e
        return params


def _write_into_place(out_path: Path, write) -> None:
    """``write(tmp)`` beside ``out_path``, renamed into place once complete."""
    tmp = out_path.parent / f".{out_path.name}.export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        if out_path.exists():
            shutil.rmtree(out_path)
        tmp.rename(out_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    """Write a LoRA checkpoint as the merged HF model (``fmt='merged'``) or a PEFT adapter
    directory (``'adapter'``); ``model_dir`` must be the base the checkpoint fingerprinted."""
    from flax import nnx

    from dlc_jax.lora.adapters import LoraParam, apply_lora, merged_model
    from dlc_jax.lora.base_check import META_KEY, base_fingerprint
    from dlc_jax.lora.export import save_peft
    from dlc_jax.model import load_hf, save_hf
    from dlc_jax.trainer.config import TrainConfig, from_dict

    if fmt not in ("merged", "adapter"):
        raise ValueError(f"--lora: {fmt!r} is not one of ['merged', 'adapter']")
    cfg = from_dict(TrainConfig, meta["config"])
    pdt = _jnp_dtype(cfg.model.param_dtype)
    model = load_hf(str(model_dir), param_dtype=pdt, scan_layers=cfg.model.scan_layers)
    apply_lora(model, cfg.lora)
    fp = base_fingerprint(nnx.state(model, nnx.Param))
    if fp != meta.get(META_KEY):
        raise ValueError(
            f"{model_dir} is not the base these adapters were trained on (fingerprint {fp}, "
            f"checkpoint {meta.get(META_KEY)}); pass the run's base with --model"
        )
    restored = restore_params(ckpt_dir, meta, _on_one_device(nnx.state(model, LoraParam)))
    nnx.update(model, restored)
    if fmt == "adapter":
        return save_peft(model, cfg.lora, out_dir, base=str(model_dir))
    merged = merged_model(model)
    merged.hf_source = str(model_dir)
    return Path(save_hf(merged, out_dir, dtype=dtype, max_shard_bytes=max_shard_bytes))


def export_checkpoint(
    ckpt_dir,
    out_dir,
    *,
    step: int | None = None,
    dtype: str = "float32",
    model_dir=None,
    max_shard_bytes: int = 2 * 1024**3,
    overwrite: bool = False,
    lora: str = "merged",
) -> tuple[int, Path]:
    """Write theta_t of checkpoint `step` (latest when None) as an HF directory; (step, out)."""
    from flax import nnx

    from dlc_jax.model import save_hf
    from dlc_jax.model.registry import build_model, config_from_pretrained
    from dlc_jax.trainer.checkpoint import Checkpointer

    if dtype not in _DTYPES:
        raise ExportError(f"--dtype: {dtype!r} is not one of {list(_DTYPES)}")
    if not max_shard_bytes > 0:
        raise ExportError(f"--max-shard-gb must be > 0, got {max_shard_bytes / 1024**3:g}")
    out_path = check_out_dir(out_dir, overwrite)
    if not Path(str(ckpt_dir)).exists() and "://" not in str(ckpt_dir):
        raise ExportError(f"no checkpoint: --checkpoint {str(ckpt_dir)!r} does not exist")
    with contextlib.closing(Checkpointer(ckpt_dir)) as ck:
        meta = ck.restore_meta(step)
    step = int(meta["step"])
    model_dir = Path(model_dir) if model_dir else model_dir_from_meta(meta)
    jdt = _jnp_dtype(dtype)
    if meta.get("lora_base_fingerprint"):  # a LoRA run: adapters only, on the run's base
        kw = {"dtype": jdt, "fmt": lora, "max_shard_bytes": max_shard_bytes}
        try:
            _write_into_place(
                out_path, lambda tmp: export_lora_checkpoint(ckpt_dir, tmp, meta, model_dir, **kw)
            )
        except ValueError as e:  # wrong base, no adapters, bad --lora
            raise ExportError(str(e)) from e
        return step, out_path
    run_model = meta.get("config", {}).get("model", {})
    pd = run_model.get("param_dtype", "float32")
    if pd not in _DTYPES:
        raise ExportError(f"checkpoint metadata: model.param_dtype {pd!r} is not one of {_DTYPES}")
    # the checkpoint holds the decoder layers in the run's layout (None: by layer count)
    config = config_from_pretrained(model_dir, scan_layers=run_model.get("scan_layers"))
    abstract = nnx.eval_shape(
        lambda: build_model(config, rngs=nnx.Rngs(0), param_dtype=_jnp_dtype(pd))
    )
    graphdef, params, *rest = nnx.split(abstract, nnx.Param, ...)
    restored = restore_params(ckpt_dir, meta, _on_one_device(params))
    model = nnx.merge(graphdef, restored, *rest)
    model.hf_source = str(model_dir)
    _write_into_place(
        out_path, lambda tmp: save_hf(model, tmp, dtype=jdt, max_shard_bytes=max_shard_bytes)
    )
    return step, out_path


def cli(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    if not a.max_shard_gb > 0:
        raise ExportError(f"--max-shard-gb must be > 0, got {a.max_shard_gb}")
    step, out = export_checkpoint(
        a.checkpoint,
        a.out,
        step=a.step,
        dtype=a.dtype,
        model_dir=a.model,
        max_shard_bytes=int(a.max_shard_gb * 1024**3),
        overwrite=a.overwrite,
        lora=a.lora,
    )
    print(f"exported step {step} of {a.checkpoint} to {out} ({a.dtype})")
    return 0


if __name__ == "__main__":
    from dlc_jax.cli import run_command

    sys.exit(run_command("export", sys.argv[1:]))
