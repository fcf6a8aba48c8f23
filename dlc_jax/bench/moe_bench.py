"""Routing replay on a tiny Qwen3-MoE: replay of the model's own routing is bitwise exact and keeps
a router gradient; the k3 KL(bf16 JAX sampler || fp32 trainer) and routing agreement with the
trainer routing by itself vs replaying the sampler's routing. Load-independent: no timings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dlc_jax.bench import common


@dataclasses.dataclass(frozen=True)
class MoeBenchConfig:
    """The tiny MoE (make_tiny dims + experts), the sampler workload, and a scale of the expert
    weights (the random init's experts are small next to the residual stream)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    expert_scale: float = 1.0
    prompts: int = 16
    n: int = 4
    max_tokens: int = 24
    seed: int = 0


SIZES = {"default": MoeBenchConfig(), "tiny": MoeBenchConfig(prompts=4, n=2, max_tokens=8)}

COLUMNS = [
    "trainer_routing",
    "tokens",
    "k3_kl",
    "mean_abs_dlogprob",
    "routing_agreement",
    "tokens_flipped",
]


ARGS = common.Options("moe", SIZES, ("--expert-scale", "expert_scale", {"type": float}))
add_args, from_args = ARGS.add_args, ARGS.from_args


def _make_model_dir(cfg: MoeBenchConfig, root: Path) -> Path:
    from dlc_jax.model import load_hf, make_tiny, save_hf

    d = make_tiny(
        root / "tiny_moe",
        seed=cfg.seed,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_size,
    )
    if cfg.expert_scale == 1.0:
        return d
    model = load_hf(d)
    for layer in model.model.layers:
        for p in (layer.mlp.experts.gate_proj, layer.mlp.experts.up_proj):
            p.kernel.set_value(p.kernel.get_value() * cfg.expert_scale)
    return save_hf(model, root / "scaled")


def exactness(model_dir: Path, seed: int) -> dict:
    """Replay of own indices == normal forward (bitwise), fp32 and bf16; router grad norm."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dlc_jax.model import load_hf

    out: dict[str, Any] = {}
    rng = np.random.default_rng(seed)
    ids = jnp.asarray(rng.integers(0, 1000, (4, 32)))
    for name, dt in (("fp32", jnp.float32), ("bf16", jnp.bfloat16)):
        model: Any = load_hf(model_dir, compute_dtype=dt)
        logits, routing = nnx.jit(lambda m, x: m(x, return_routing=True))(model, ids)
        replayed = nnx.jit(lambda m, x, r: m(x, routed_experts=r))(model, ids, routing.experts)
        out[f"replay_own_bitwise_{name}"] = bool(np.array_equal(logits, replayed))
    model = load_hf(model_dir)
    graphdef, params = nnx.split(model, nnx.Param)
    _, routing = model(ids, return_routing=True)

    def loss(p):
        return jnp.mean(nnx.merge(graphdef, p)(ids, routed_experts=routing.experts) ** 2)

    g = jax.grad(loss)(params)
    norms = [
        float(jnp.linalg.norm(layer["mlp"]["gate"]["weight"].get_value()))
        for layer in g["model"]["layers"].values()
    ]
    out["router_grad_norm_min"] = min(norms)
    return out


def _rollouts(model_dir: Path, cfg: MoeBenchConfig) -> list:
    from dlc_jax.sampler.backends import BackendConfig, make_backend
    from dlc_jax.sampler.wire.types import SamplingParams

    b = make_backend(
        "jax", BackendConfig(model_dir=str(model_dir), dtype="bfloat16", max_model_len=128)
    )
    rng = np.random.default_rng(cfg.seed)
    prompts = [(i, rng.integers(0, 1000, 6 + i % 5).tolist()) for i in range(cfg.prompts)]
    params = SamplingParams(
        n=cfg.n,
        max_tokens=cfg.max_tokens,
        temperature=1.0,
        seed=cfg.seed,
        return_routed_experts=True,
    )

    async def go():
        await b.start()
        try:
            return [r async for r in b.generate("bench", prompts, params)]
        finally:
            await b.close()

    return asyncio.run(go())


def mismatch(model_dir: Path, cfg: MoeBenchConfig) -> list[dict]:
    """k3 KL and routing agreement, fp32 trainer vs bf16 sampler, without / with replay."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dlc_jax.model import load_hf
    from dlc_jax.model.routing import routing_mismatch

    rolls = _rollouts(model_dir, cfg)
    model = load_hf(model_dir)
    sparse = [model.config.is_sparse(i) for i in range(model.config.num_hidden_layers)]
    fwd = nnx.jit(lambda m, x, r: m(x, routed_experts=r, return_routing=True))
    fwd_own = nnx.jit(lambda m, x: m(x, return_routing=True))
    rows = []
    for mode in ("own", "replay sampler"):
        d_all, agree, flipped, n = [], [], [], 0
        for r in rolls:
            p, t = len(r.prompt_ids), len(r.response_ids)
            seq = jnp.asarray(np.concatenate([r.prompt_ids, r.response_ids])[None])
            routed = np.zeros((1, p + t, *r.routed_experts.shape[1:]), np.int32)
            routed[0, : p + t - 1] = r.routed_experts
            logits, routing = fwd_own(model, seq) if mode == "own" else fwd(model, seq, routed)
            lp = jax.nn.log_softmax(logits[0].astype(jnp.float32), -1)
            lp_t = np.asarray(lp[p - 1 : p + t - 1][np.arange(t), r.response_ids])
            d_all.append(lp_t - r.logprobs)
            mask = np.zeros((1, p + t), np.float32)
            mask[0, : p + t - 1] = 1.0
            m = routing_mismatch(routing.experts, routed, mask, sparse)
            agree.append(float(m["moe/routing_agreement"]) * (p + t - 1))
            flipped.append(float(m["moe/tokens_flipped"]) * (p + t - 1))
            n += p + t - 1
        d = np.concatenate(d_all).astype(np.float64)
        rows.append(
            {
                "trainer_routing": mode,
                "tokens": int(d.size),
                "k3_kl": float(np.mean(np.exp(d) - 1.0 - d)),
                "mean_abs_dlogprob": float(np.mean(np.abs(d))),
                "routing_agreement": sum(agree) / n,
                "tokens_flipped": sum(flipped) / n,
            }
        )
    return rows


def run(cfg: MoeBenchConfig) -> dict:
    res = common.new_result(
        "moe", "Routing replay on a tiny Qwen3-MoE (bf16 JAX sampler vs fp32 trainer)", COLUMNS, cfg
    )
    with tempfile.TemporaryDirectory(prefix="dlc_moe_bench_") as tmp:
        model_dir = _make_model_dir(cfg, Path(tmp))
        ex = exactness(model_dir, cfg.seed)
        rows = mismatch(model_dir, cfg)
    res["rows"], res["exactness"] = rows, ex
    k_own, k_rep = rows[0]["k3_kl"], rows[1]["k3_kl"]
    ratio = k_own / k_rep if k_rep > 0 else float("inf")
    bitwise = "replay of own routing bitwise identical, {} (1 = yes)"
    lower_bounds: list[tuple[str, Any, float]] = [  # (target, value, bound): value >= bound
        *((bitwise.format(p), ex[f"replay_own_bitwise_{p}"], 1) for p in ("fp32", "bf16")),
        ("router gradient norm under replay (smallest layer)", ex["router_grad_norm_min"], 1e-12),
        ("k3 KL without replay / with replay", ratio, 2.0),
    ]
    res["targets"] = [common.target(n, float(v), b, ">=") for n, v, b in lower_bounds]
    res["notes"] = [
        f"tiny Qwen3-MoE: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_experts} experts, top {cfg.num_experts_per_tok}, expert width "
        f"{cfg.moe_intermediate_size}, expert weights x{cfg.expert_scale}; sampler: the JAX "
        f"backend in bf16 (fp32 router), {cfg.prompts} prompts x {cfg.n} samples x "
        f"{cfg.max_tokens} tokens at temperature 1; trainer: the same weights in fp32",
        "k3_kl: mean over sampled response tokens of r - 1 - log r, r = p_trainer / q_sampler "
        "(an unbiased estimate of KL(sampler || trainer)); routing agreement / tokens flipped: "
        "the trainer's own top-k against the sampler's over every position the sampler ran",
        "load-independent: every figure is a number of a fixed computation, not a timing",
    ]
    return common.finish(res)
