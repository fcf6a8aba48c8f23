"""`dlc-jax export --checkpoint DIR [--step N] --out HF_DIR [--dtype bfloat16|float32] [--model
HF_DIR]`:
turn an orbax training checkpoint (`dlc_jax.trainer.checkpoint.Checkpointer`, whose `state` item has
a
`params` subtree = theta_t as an `nnx.Param` state) into an HF directory for serving (vLLM,
transformers, `dlc-jax sampler serve`).

Only the `params` subtree is read (orbax partial restore: no optimizer state, no theta_s snapshots).
The architecture and tokenizer come from `--model`, else from the run's config stored in the
checkpoint metadata (the SFT-warmed directory when `sft.enabled`, else `model.path`). Writing goes
through `dlc_jax.model.save_hf` (streamed, one tensor at a time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_DTYPES = ("float32", "bfloat16")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlc-jax export", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint", required=True, help="orbax checkpoint directory of a run (checkpoint.dir)"
    )
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--out", required=True, help="output HF directory")
    p.add_argument(
        "--dtype", choices=_DTYPES, default="float32", help="dtype of the written tensors"
    )
    p.add_argument(
        "--model",
        default=None,
        help="HF directory of the run's initial model (config + tokenizer); "
        "default: from the checkpoint's config",
    )
    p.add_argument(
        "--max-shard-gb", type=float, default=2.0, help="largest safetensors shard (GiB)"
    )
    p.add_argument(
        "--lora",
        choices=("merged", "adapter"),
        default="merged",
        help="a LoRA run's checkpoint: the merged HF model, or the adapter alone (PEFT layout)",
    )
    return p


def model_dir_from_meta(meta: dict) -> Path:
    """The run's initial HF directory named by the config saved in the checkpoint metadata."""
    from dlc_jax.trainer.config import ConfigError, TrainConfig, from_dict
    from dlc_jax.trainer.sft import sft_cache_dir

    if "config" not in meta:
        raise ValueError("checkpoint metadata has no 'config'; pass --model HF_DIR")
    try:
        cfg = from_dict(TrainConfig, meta["config"])
    except ConfigError as e:
        raise ValueError(
            f"checkpoint metadata config is not readable ({e}); pass --model HF_DIR"
        ) from e
    if cfg.sft.enabled:
        d = sft_cache_dir(cfg)
    elif cfg.model.path:
        d = Path(cfg.model.path)
    else:
        d = Path(cfg.sft.cache_dir) / f"tiny-{cfg.model.preset}-seed{cfg.train.seed}"
    if not (d / "config.json").exists():
        raise ValueError(
            f"the run's model directory {str(d)!r} (from the checkpoint config) has no "
            "config.json; "
            f"pass --model HF_DIR"
        )
    return d


def restore_params(ckpt_dir, step: int | None, abstract_params):
    """(step, params): the `params` subtree of the checkpoint `state` item, restored onto the
    shapes/dtypes/shardings of `abstract_params` (an nnx.State of ShapeDtypeStruct)."""
    import jax
    import orbax.checkpoint as ocp

    from dlc_jax.trainer.checkpoint import Checkpointer, CheckpointError

    ck = Checkpointer(ckpt_dir)
    try:
        step = ck._resolve(step)
        target = {"params": abstract_params}
        restore_args = jax.tree.map(
            lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype), target
        )
        try:
            out = ck._mgr.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.PyTreeRestore(
                        item=target, restore_args=restore_args, partial_restore=True
                    )
                ),
            )
        except Exception as e:  # orbax raises many types; rewrap naming the checkpoint
            raise CheckpointError(
                f"checkpoint {ck.directory}/{step}: params unreadable or not matching the model "
                f"({type(e).__name__}: {str(e)[:500]})"
            ) from e
        return step, out["state"]["params"]
    finally:
        ck.close()


def export_checkpoint(
    ckpt_dir,
    out_dir,
    *,
    step: int | None = None,
    dtype: str = "float32",
    model_dir=None,
    max_shard_bytes: int = 2 * 1024**3,
    lora: str = "merged",
) -> tuple[int, Path]:
    """Write theta_t of checkpoint `step` (latest when None) as an HF directory; returns (step,
    out_dir)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dlc_jax.model import Qwen3Config, Qwen3ForCausalLM, save_hf
    from dlc_jax.trainer.checkpoint import Checkpointer

    if dtype not in _DTYPES:
        raise ValueError(f"--dtype: {dtype!r} is not one of {list(_DTYPES)}")
    ck = Checkpointer(ckpt_dir)
    try:
        meta = ck.restore_meta(step)
    finally:
        ck.close()
    step = int(meta["step"])
    model_dir = Path(model_dir) if model_dir else model_dir_from_meta(meta)
    if meta.get("lora_base_fingerprint"):  # a LoRA run: adapters only, on the run's base
        from dlc_jax.lora.export import export_lora_checkpoint

        jdt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
        out_path = export_lora_checkpoint(
            ckpt_dir, out_dir, meta, model_dir, dtype=jdt, fmt=lora, max_shard_bytes=max_shard_bytes
        )
        return step, out_path
    run_model = meta.get("config", {}).get("model", {})
    param_dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[
        run_model.get("param_dtype", "float32")
    ]
    # the checkpoint holds the decoder layers in the run's layout (None: by layer count)
    config = Qwen3Config.from_pretrained(model_dir, scan_layers=run_model.get("scan_layers"))
    abstract = nnx.eval_shape(
        lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0), param_dtype=param_dtype)
    )
    graphdef, params, *rest = nnx.split(abstract, nnx.Param, ...)
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract_params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), params
    )
    step, restored = restore_params(ckpt_dir, step, abstract_params)
    model = nnx.merge(graphdef, restored, *rest)
    model.hf_source = str(model_dir)
    out = save_hf(
        model,
        out_dir,
        dtype={"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype],
        max_shard_bytes=max_shard_bytes,
    )
    return step, Path(out)


def cli(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    from dlc_jax.trainer.checkpoint import CheckpointError

    try:
        step, out = export_checkpoint(
            a.checkpoint,
            a.out,
            step=a.step,
            dtype=a.dtype,
            model_dir=a.model,
            max_shard_bytes=int(a.max_shard_gb * 1024**3),
            lora=a.lora,
        )
    except (CheckpointError, ValueError, FileNotFoundError) as e:
        print(f"dlc-jax export: {e}", file=sys.stderr)
        return 2
    print(f"exported step {step} of {a.checkpoint} to {out} ({a.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
