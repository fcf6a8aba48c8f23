"""DLC overhead: the DLC step (theta_s forward, then the ``dlc`` loss with a ``head_k`` head; every
token stale) vs a plain GRPO step (``naive`` loss, no head, no theta_s forward), both with AdamW, in
time and in XLA FLOPs; and end-to-end, the async trainer loop against a JAX sampler on loopback.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dlc_jax.bench import common


@dataclasses.dataclass(frozen=True)
class DlcBenchConfig(common.BenchShape):
    """Model dims, batch rows x length, head size K, timing repeats."""

    batch: int = 8
    length: int = 128
    head_k: int = 8
    chunk_size: int = 256
    warmup: int = 1
    repeats: int = 5
    seed: int = 0
    # end-to-end (async trainer loop + JAX-backend sampler over loopback gRPC, a tiny model)
    end_to_end: bool = True
    e2e_steps: int = 10
    e2e_skip: int = 2  # first steps (compilation, sampler start) not counted
    e2e_rounds: int = 2  # GRPO, DLC, GRPO, DLC, ...
    e2e_hidden: int = 128
    e2e_layers: int = 2
    e2e_vocab: int = 2048
    e2e_batch_prompts: int = 4
    e2e_n: int = 4
    e2e_max_tokens: int = 8
    e2e_resync_k: int = 2


SIZES = {
    "default": DlcBenchConfig(**common.shape("small")),
    "tiny": DlcBenchConfig(
        **common.shape("tiny"),
        batch=4,
        length=32,
        head_k=4,
        chunk_size=64,
        repeats=2,
        end_to_end=False,
    ),
}

COLUMNS = [
    "variant",
    "step_ms",
    "tokens_per_s",
    "ratio_vs_grpo",
    "snapshot_forward_ms",
    "train_step_ms",
]


def make_batch(cfg: DlcBenchConfig) -> dict:
    """A packed step batch, the second half of each row response tokens, every token stale."""
    rng = np.random.default_rng(cfg.seed)
    b, t, k, v = cfg.batch, cfg.length, cfg.head_k, cfg.vocab_size
    ids, targets = common.token_batch(rng, v, b, t)
    mask = np.zeros((b, t), np.float32)
    mask[:, t // 2 :] = 1.0
    return {
        "input_ids": ids,
        "targets": targets,
        "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
        "attention_mask": np.ones((b, t), np.int32),
        "mask": mask,
        "lp_q": (-rng.exponential(3.0, (b, t))).astype(np.float32),
        "lp_s": np.zeros((b, t), np.float32),
        "self_mask": np.zeros((b, t), bool),
        "head_ids": rng.integers(0, v, (b, t, k), dtype=np.int32),
        "lq_head": np.sort(-rng.exponential(3.0, (b, t, k)), axis=-1)[..., ::-1]
        .astype(np.float32)
        .copy(),
        "lps_head": np.zeros((b, t, k), np.float32),
        "adv": rng.standard_normal(b).astype(np.float32),
    }


def run(cfg: DlcBenchConfig = SIZES["default"]) -> dict:
    import optax
    from flax import nnx

    from dlc_jax.model import Qwen3ForCausalLM
    from dlc_jax.rl import LossConfig
    from dlc_jax.trainer.step import (
        StepConfig,
        device_batch,
        make_snapshot_logprobs,
        make_train_step,
    )

    res = common.new_result("dlc", "DLC step overhead vs plain GRPO", COLUMNS, cfg)
    model = Qwen3ForCausalLM(cfg.model_config(), rngs=nnx.Rngs(cfg.seed))
    graphdef, params = nnx.split(model, nnx.Param)
    model_s = Qwen3ForCausalLM(cfg.model_config(), rngs=nnx.Rngs(cfg.seed + 1))  # theta_s
    params_s = nnx.split(model_s, nnx.Param)[1]
    tx = optax.adamw(1e-5)
    opt_state = tx.init(params)
    batch = device_batch(make_batch(cfg))

    grpo_cfg = StepConfig(loss=LossConfig(name="naive"), head_k=0, chunk_size=cfg.chunk_size)
    dlc_cfg = StepConfig(loss=LossConfig(name="dlc"), head_k=cfg.head_k, chunk_size=cfg.chunk_size)
    grpo_step = make_train_step(graphdef, tx, grpo_cfg)
    dlc_step = make_train_step(graphdef, tx, dlc_cfg)
    snap = make_snapshot_logprobs(graphdef, dlc_cfg)

    def with_snapshot():
        """The batch with theta_s's log-probs (the DLC step's input)."""
        lp_s, lps_head = snap(params_s, batch)
        return dict(batch, lp_s=lp_s, lps_head=lps_head)

    batch_s = with_snapshot()
    _, _, dm = dlc_step(params, opt_state, batch_s)
    res["dlc_metrics_sample"] = {
        k: float(np.asarray(v))
        for k, v in dm.items()
        if k in ("loss/loss", "loss/dlc_centering_active", "ess_lag", "grad_norm")
    }
    if float(np.asarray(dm.get("loss/dlc_centering_active", 0.0))) != 1.0:
        raise RuntimeError(
            "DLC step ran without its centering head (loss/dlc_centering_active != 1)"
        )

    fns = {
        "grpo": lambda: grpo_step(params, opt_state, batch),
        "dlc": lambda: dlc_step(params, opt_state, with_snapshot()),
        "snapshot": lambda: snap(params_s, batch),
        "dlc_train": lambda: dlc_step(params, opt_state, batch_s),
    }
    times = common.time_interleaved(fns, warmup=cfg.warmup, repeats=cfg.repeats)
    med = common.best_times(res, times)
    tokens = cfg.batch * cfg.length
    g, d = med["grpo"], med["dlc"]
    dlc_variant = f"DLC (theta_s forward + dlc loss + head K={cfg.head_k})"
    res["rows"] = [
        _row("plain GRPO (naive loss, no theta_s forward, no head)", g, g, tokens, 0.0, 1e3 * g),
        _row(dlc_variant, d, g, tokens, 1e3 * med["snapshot"], 1e3 * med["dlc_train"]),
    ]
    ratio = d / g
    res["summary"] = {"ratio_dlc_vs_grpo_isolated": ratio, "ratio_dlc_vs_grpo_end_to_end": None}
    res["targets"].append(common.target("DLC / GRPO step time (isolation)", ratio, 1.35, "<="))
    fl = {
        "grpo": _xla_flops(grpo_step, params, opt_state, batch),
        "dlc_train": _xla_flops(dlc_step, params, opt_state, batch_s),
        "snapshot": _xla_flops(snap, params_s, batch),
    }
    res["xla_flops"] = fl
    if fl["grpo"] and fl["dlc_train"] is not None and fl["snapshot"] is not None:
        ratio_fl = (fl["dlc_train"] + fl["snapshot"]) / fl["grpo"]
        res["summary"]["flops_ratio_dlc_vs_grpo"] = ratio_fl
        res["notes"].append(
            f"XLA cost analysis: GRPO step {fl['grpo']:.3e} FLOPs, DLC step {fl['dlc_train']:.3e} "
            f"+ theta_s forward {fl['snapshot']:.3e} -> FLOP ratio {ratio_fl:.3f} "
            "(what the time ratio approaches on an unloaded machine)"
        )
    r = None
    if not cfg.end_to_end:
        res["notes"].append("end-to-end: not run at this size")
    else:
        e2e = end_to_end(cfg)
        res["end_to_end"] = e2e
        r = e2e["ratio_dlc_vs_grpo"]
        res["summary"]["ratio_dlc_vs_grpo_end_to_end"] = r
        sec = e2e["seconds_per_step"]
        for v in ("grpo", "dlc"):
            variant = f"end-to-end {v.upper()} (async loop + gRPC JAX sampler)"
            res["rows"].append(_row(variant, sec[v], sec["grpo"]))
        res["notes"].append(
            f"end-to-end: tiny Qwen3 (D={cfg.e2e_hidden}, {cfg.e2e_layers} layers, "
            f"V={cfg.e2e_vocab}), {cfg.e2e_batch_prompts} prompts x n={cfg.e2e_n}, "
            f"{cfg.e2e_max_tokens} new tokens, resync every {cfg.e2e_resync_k} steps for both, "
            f"prefetch 1; {cfg.e2e_steps} steps per run, first {cfg.e2e_skip} not counted, median "
            f"seconds/step of a run (incl. waiting for rollouts), best of {cfg.e2e_rounds} "
            f"alternating rounds; theta_s forwards run: GRPO {e2e['snapshot_forwards']['grpo']} "
            f"(an async GRPO never evaluates theta_s), DLC {e2e['snapshot_forwards']['dlc']}"
        )
    res["targets"].append(common.target("DLC / GRPO step time (end-to-end, async)", r, 1.10, "<="))
    mc = cfg.model_config()
    res["notes"] += [
        f"model: {mc.num_hidden_layers} layers, D={mc.hidden_size}, V={mc.vocab_size}, fp32; "
        f"batch {cfg.batch} x {cfg.length}, half of each row response tokens; all tokens stale "
        "(theta_s forward always runs)",
        "snapshot_forward_ms and train_step_ms are timed separately; step_ms of DLC is the two "
        "in sequence",
    ]
    return common.finish(res)


def _row(variant: str, sec: float, grpo_sec: float, tokens=None, snapshot_ms=None, train_ms=None):
    """A table row: ``sec`` seconds per step, against GRPO's ``grpo_sec``."""
    return {
        "variant": variant,
        "step_ms": 1e3 * sec,
        "tokens_per_s": None if tokens is None else tokens / sec,
        "ratio_vs_grpo": sec / grpo_sec,
        "snapshot_forward_ms": snapshot_ms,
        "train_step_ms": train_ms,
    }


ARGS = common.Options("dlc", SIZES, ("--repeats", "repeats", {"type": int}))
add_args, from_args = ARGS.add_args, ARGS.from_args


# the end-to-end runs' fixed settings (both variants; the sizes come from the bench config)
E2E_OVERRIDES = (
    "sft.enabled=false sampler.backend=jax resync.policy=every_k async.prefetch=1 "
    "log.progress=false log.tensorboard=false checkpoint.every=0 checkpoint.resume=false"
)


def _xla_flops(jitted, *args) -> float | None:
    """FLOPs of one call from XLA's cost analysis of the compiled program (None if not reported)."""
    ca = jitted.lower(*args).compile().cost_analysis()
    v = ((ca[0] if isinstance(ca, (list, tuple)) else ca) or {}).get("flops")
    return None if v is None or v < 0 else float(v)


def end_to_end(cfg: DlcBenchConfig) -> dict:
    """Seconds per step of the async loop, GRPO vs DLC, each with its own JAX sampler process."""
    import json
    import tempfile
    from pathlib import Path

    from dlc_jax.model.tiny import make_tiny
    from dlc_jax.trainer.build import build_trainer
    from dlc_jax.trainer.config import default_config_path, load_config

    def grpo_trainer(cfg):
        """The loop with its theta_s forward removed: every token counts as current."""
        t = build_trainer(cfg)
        device_inputs = t.inputs.device_inputs

        def current_only(arrays, state):
            return device_inputs(
                dict(arrays, version=np.full_like(arrays["version"], state.version)), state
            )

        setattr(t.inputs, "device_inputs", current_only)  # noqa: B010
        return t

    per_step: dict[str, list[float]] = {"grpo": [], "dlc": []}
    forwards = {"grpo": 0, "dlc": 0}
    with tempfile.TemporaryDirectory(prefix="dlc_bench_e2e_") as d:
        tmp = Path(d)
        model_dir = make_tiny(
            tmp / "model",
            vocab_size=cfg.e2e_vocab,
            hidden_size=cfg.e2e_hidden,
            intermediate_size=2 * cfg.e2e_hidden,
            num_hidden_layers=cfg.e2e_layers,
            head_dim=32,
        )
        variants = {
            "grpo": ["loss.name=naive", "sampler.head_k=0"],
            "dlc": ["loss.name=dlc", f"sampler.head_k={cfg.head_k}"],
        }
        shared = [f"model.path={model_dir}", *E2E_OVERRIDES.split()]
        shared += [f"sampler.n={cfg.e2e_n}", f"sampler.max_tokens={cfg.e2e_max_tokens}"]
        shared += [f"train.batch_prompts={cfg.e2e_batch_prompts}", f"train.steps={cfg.e2e_steps}"]
        shared += [f"resync.k={cfg.e2e_resync_k}", f"train.seed={cfg.seed}"]
        for rnd in range(cfg.e2e_rounds):
            for v, extra in variants.items():
                run_dir = tmp / f"{v}{rnd}"
                run_keys = [f"log.dir={run_dir}/logs", f"checkpoint.dir={run_dir}/ckpt"]
                tc = load_config(default_config_path(), [*shared, *run_keys, *extra])
                summary = (grpo_trainer if v == "grpo" else build_trainer)(tc).run()
                if not summary.get("finished"):
                    raise RuntimeError(f"end-to-end {v} run did not finish: {summary}")
                rows = [
                    json.loads(line)
                    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()
                ]
                steady = [r["step_s"] for r in rows[cfg.e2e_skip :]]
                if not steady:
                    raise ValueError(
                        f"e2e_steps={cfg.e2e_steps} leaves no step after e2e_skip={cfg.e2e_skip}"
                    )
                # the median: robust to a recompile for a new length bucket
                per_step[v].append(common.median(steady))
                forwards[v] += int(summary.get("snapshot_forwards", 0))
    sec = {v: common.best(x) for v, x in per_step.items()}
    return {
        "seconds_per_step_runs": per_step,
        "seconds_per_step": sec,
        "snapshot_forwards": forwards,
        "ratio_dlc_vs_grpo": sec["dlc"] / sec["grpo"],
    }
