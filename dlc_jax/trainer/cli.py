"""`dlc-jax train --config configs/NAME.yaml [key.sub=value ...]` (no --config: the embedded
tiny_cpu). A config file may start from another with ``base: NAME_OR_PATH`` (e.g. ``base:
tiny_cpu``); ``--print-config`` prints every key of the resolved config."""

from __future__ import annotations

import json
import logging

from dlc_jax.cli_args import ArgumentParser


def cli(argv: list[str]) -> int:
    p = ArgumentParser(prog="dlc-jax train", description=__doc__)
    p.add_argument(
        "--config",
        default=None,
        help="YAML config, a path or a packaged name such as tiny_cpu or qwen3_0p6b_gsm8k "
        "(default: the embedded tiny_cpu)",
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument(
        "overrides",
        nargs="*",
        help="key.sub=value overrides, e.g. optim.lr=1e-5 resync.policy=never",
    )
    a = p.parse_args(argv)

    from dlc_jax.trainer.config import default_config_path, dump_config, load_config

    path = a.config or default_config_path()
    cfg = load_config(path, a.overrides)
    if a.print_config:
        print(dump_config(cfg))
        return 0
    # on a TPU: the compiler flags `dlc-jax plan` compiled with (read once, when JAX loads libtpu)
    from dlc_jax import tpu_flags

    tpu_flags.apply(cfg.plan.libtpu_flags)
    # multi-host: jax.distributed must be up before any JAX computation (the Trainer makes the mesh)
    from dlc_jax.trainer import distributed

    info = distributed.initialize(cfg.distributed)
    from dlc_jax.trainer.build import build_trainer

    lead = info.is_leader
    if not lead:  # logs, metrics and the progress bar come from process 0
        logging.getLogger("dlc_jax").setLevel(logging.WARNING)
    where = (
        f"; process {info.process_index}/{info.process_count}, "
        f"{info.local_devices}/{info.global_devices} devices"
        if info.process_count > 1
        else ""
    )
    if lead:
        print(
            f"dlc-jax train: config {path} ({len(a.overrides)} overrides); loss {cfg.loss.name}, "
            f"resync {cfg.resync.policy}, sampler {cfg.sampler.backend}, {cfg.train.steps} "
            f"steps{where}",
            flush=True,
        )
    summary = build_trainer(cfg).run()
    if not lead:
        return 0 if summary.get("finished") else 1
    if summary.get("already_complete"):
        return 0  # the Trainer said so and where the outputs are
    r = summary.get("reward_mean", {})
    line = {
        "model": summary.get("model"),
        "steps": summary.get("last_step"),
        "seconds": round(summary.get("seconds", 0.0), 1),
        # window means: the first / last 10% of steps (one step alone is noisy)
        "reward_first_10pct": r.get("first_10pct"),
        "reward_last_10pct": r.get("last_10pct"),
        "reward_mean": r.get("mean"),
        "ess_lag_min": summary.get("ess_lag", {}).get("min"),
        "resyncs": summary.get("resync_count"),
        "resyncs_ess": summary.get("resync_ess"),
        "reconnects": summary.get("reconnects"),
    }
    if acc := summary.get("eval/accuracy", {}):
        line.update(eval_accuracy_first=acc.get("first"), eval_accuracy_last=acc.get("last"))
    print(json.dumps(line), flush=True)
    if sft := summary.get("sft"):
        print(f"sft: warmed up {sft['steps']} steps first; trained copy {sft['model_dir']}")
    d = summary["metrics_dir"]
    print(f"metrics: {d}/metrics.jsonl (TensorBoard: {d}/tb, summary: {d}/summary.json)")
    print(f"checkpoint: {summary['checkpoint_dir']} (step {summary['checkpoint_step']})")
    return 0 if summary.get("finished") else 1
