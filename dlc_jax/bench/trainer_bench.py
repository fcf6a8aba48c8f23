"""Trainer-step throughput: tokens/s of the mean next-token NLL and its gradient (no optimizer
update) for our NNX Qwen3 (chunked ``token_logprobs``, the trainer's path, and full logits) vs
``transformers`` (same weights) and ``google-tunix`` (when it installs), same batch, same process.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from dlc_jax.bench import common, flops


@dataclasses.dataclass(frozen=True)
class TrainerBenchConfig(common.BenchShape):
    """Model dims (a small Qwen3), batch [batch, length], timing repeats, which peers to run."""

    batch: int = 2
    length: int = 256
    chunk_size: int = 256
    warmup: int = 1
    repeats: int = 3
    tunix: bool = True
    tunix_dir: str = str(Path(tempfile.gettempdir()) / "dlc_jax_bench_tunix")
    seed: int = 0
    name: str = "trainer"  # result file name (<out>/<name>.json, .md)

    def model_config(self, **extra):
        return super().model_config(max_position_embeddings=max(4096, self.length), **extra)


SIZES = {
    "default": TrainerBenchConfig(**common.shape("small")),
    "tiny": TrainerBenchConfig(
        **common.shape("tiny"), batch=2, length=32, chunk_size=32, repeats=2, tunix=False
    ),
    # Qwen3-0.6B's vocabulary and width with 4 layers: the LM head dominates, as in RL fine-tuning.
    "qwen3_vocab": TrainerBenchConfig(
        **common.shape("qwen3_0p6b", num_hidden_layers=4), batch=1, length=256, repeats=2
    ),
    # Qwen3-0.6B's full shape (28 layers, tied embeddings; scanned layers in ours)
    "qwen3_0p6b": TrainerBenchConfig(
        **common.shape("qwen3_0p6b"),
        batch=1,
        length=256,
        repeats=2,
        tunix=False,
        name="trainer_qwen3_0p6b",
    ),
}

COLUMNS = [
    "implementation",
    "tokens_per_s",
    "step_ms",
    "ratio_vs_transformers",
    "achieved_gflop_s",
    "mfu",
    "loss",
]


def _our_fns(model, ids, tgt, chunk_size):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dlc_jax.rl import token_logprobs

    graphdef, params = nnx.split(model, nnx.Param)
    ids_j, tgt_j = jnp.asarray(ids), jnp.asarray(tgt)

    def chunked_loss(p):
        m = nnx.merge(graphdef, p)
        h = m.hidden_states(ids_j)
        tl = token_logprobs(h, m.unembedding(), tgt_j, chunk_size=chunk_size, compute_entropy=False)
        return -jnp.mean(tl.lp)

    def full_loss(p):
        m = nnx.merge(graphdef, p)
        lp = jax.nn.log_softmax(m(ids_j).astype(jnp.float32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(lp, tgt_j[..., None], axis=-1))

    chunked = jax.jit(jax.value_and_grad(chunked_loss))
    full = jax.jit(jax.value_and_grad(full_loss))
    return (lambda: chunked(params)), (lambda: full(params))


def run(cfg: TrainerBenchConfig = SIZES["default"]) -> dict:
    import jax
    from flax import nnx

    from dlc_jax.bench import peers
    from dlc_jax.model import Qwen3ForCausalLM

    res = common.new_result(
        cfg.name, "Trainer step: forward+backward tokens/s vs peers", COLUMNS, cfg
    )
    mcfg = cfg.model_config()
    rng = np.random.default_rng(cfg.seed)
    ids, tgt = common.token_batch(rng, cfg.vocab_size, cfg.batch, cfg.length)

    model = Qwen3ForCausalLM(mcfg, rngs=nnx.Rngs(cfg.seed))
    ours_chunked, ours_full = _our_fns(model, ids, tgt, cfg.chunk_size)
    tmodel = peers.torch_qwen3(mcfg, model)
    torch_step = peers.torch_loss_and_grad_fn(tmodel, ids, tgt)

    fns = {
        "ours (chunked logprobs)": ours_chunked,
        "ours (full logits)": ours_full,
        "transformers": torch_step,
    }
    if cfg.tunix:
        ok, msg = peers.prepare_tunix(cfg.tunix_dir)
        res["config"]["tunix_status"] = msg
        if ok:
            res["notes"].append(
                f"tunix: {msg} (installed with pip --no-deps into a side folder, not the main "
                "environment)"
            )
            try:
                tunix_model = peers.tunix_qwen3(mcfg, seed=cfg.seed)
                fns["tunix"] = peers.tunix_loss_and_grad_fn(tunix_model, ids, tgt)
            except Exception as e:  # noqa: BLE001 - a failing peer is a result, not a crash
                res["notes"].append(
                    f"tunix: installed but its Qwen3 failed to run: {type(e).__name__}: {e}"
                )
        else:
            res["notes"].append(f"tunix: not measured — {msg}")
    else:
        res["notes"].append("tunix: not requested at this size")

    losses = {}
    for k, fn in fns.items():
        out = fn()
        losses[k] = float(out) if isinstance(out, float) else float(np.asarray(out[0]))
    times = common.time_interleaved(fns, warmup=cfg.warmup, repeats=cfg.repeats)

    step_flops = flops.qwen3_train_flops(mcfg, cfg.batch, cfg.length)
    kind = res["machine"].get("device_kind", "cpu")
    med, chips = common.best_times(res, times), jax.device_count()
    for k in fns:
        fl = step_flops / med[k]
        res["rows"].append(
            {
                "implementation": k,
                "tokens_per_s": cfg.batch * cfg.length / med[k],
                "step_ms": 1e3 * med[k],
                "ratio_vs_transformers": med["transformers"] / med[k],
                "achieved_gflop_s": fl / 1e9,
                "mfu": None if k == "transformers" else flops.mfu(fl, kind, n_chips=chips),
                "loss": losses[k],
            }
        )
    res["flops_per_step"] = step_flops
    ours = med["ours (chunked logprobs)"]
    ratio = med["transformers"] / ours
    loss_diff = abs(losses["ours (chunked logprobs)"] - losses["transformers"])
    res["summary"] = {
        "ratio_ours_vs_transformers": ratio,
        "ratio_ours_full_logits_vs_transformers": med["transformers"] / med["ours (full logits)"],
        "ratio_ours_vs_tunix": med["tunix"] / ours if "tunix" in med else None,
        "loss_abs_diff_ours_vs_transformers": loss_diff,
    }
    res["targets"].append(common.target("ours (chunked) / transformers tokens/s", ratio, 1.0, ">="))
    res["notes"] += [
        f"model: {mcfg.num_hidden_layers} layers, D={mcfg.hidden_size}, "
        f"F={mcfg.intermediate_size}, H={mcfg.num_attention_heads}/KV={mcfg.num_key_value_heads}, "
        f"hd={mcfg.head_dim}, V={mcfg.vocab_size}, fp32; "
        f"{'scanned' if mcfg.use_scan else 'unrolled'} layers in ours; batch {cfg.batch} x "
        f"{cfg.length} tokens; best of {cfg.repeats} interleaved repeats after {cfg.warmup} "
        "warm-up",
        f"same weights in ours and transformers: |loss difference| = {loss_diff:.2e} (tunix uses "
        "its own random init)",
        f"FLOPs per step (3x forward, attention full TxT) = {step_flops:.3e}; MFU needs a known "
        f"peak: n/a on CPU ({kind}), computed on TPU v4/v5e/v5p and H100/H200",
    ]
    return common.finish(res)


ARGS = common.Options(
    "trainer",
    SIZES,
    ("--no-tunix", "tunix", "skip the google-tunix peer", lambda _: False),
    ("--repeats", "repeats", {"type": int}),
)
add_args, from_args = ARGS.add_args, ARGS.from_args
