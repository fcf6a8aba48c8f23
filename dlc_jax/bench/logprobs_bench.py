"""Log-prob memory: our chunked ``token_logprobs`` vs a naive full softmax ([B,T,V] f32) as batch x
length grows, from XLA's buffer assignment of compile-only programs (so the naive path is analysed
even where it would not fit), forward and forward+backward; both are run and compared at one point.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dlc_jax.bench import common


@dataclasses.dataclass(frozen=True)
class LogprobBenchConfig:
    """V, D (Qwen3-0.6B's by default), the [B, T] points, our chunk size."""

    vocab_size: int = 151936
    hidden_size: int = 1024
    points: tuple = ((1, 256), (1, 1024), (2, 2048), (4, 2048), (8, 2048))
    chunk_size: int = 256
    check_point: tuple = (1, 64)  # run both paths here and compare values


SIZES = {
    "default": LogprobBenchConfig(),
    "tiny": LogprobBenchConfig(
        vocab_size=4096,
        hidden_size=64,
        points=((1, 64), (2, 64), (4, 64)),
        chunk_size=32,
        check_point=(1, 32),
    ),
}

COLUMNS = [
    "batch_x_length",
    "tokens",
    "ours_fwd_MiB",
    "naive_fwd_MiB",
    "fwd_ratio",
    "ours_fwd_bwd_MiB",
    "naive_fwd_bwd_MiB",
    "fwd_bwd_ratio",
    "ours_fwd_bwd_total_MiB",
    "naive_fwd_bwd_total_MiB",
    "total_ratio",
]

MiB = float(1 << 20)


def naive_logprobs(hidden, unembed, targets):
    """[B,T,D] x [V,D] -> log p(targets) [B,T] through a full [B,T,V] log-softmax."""
    import jax
    import jax.numpy as jnp

    logits = jnp.einsum("btd,vd->btv", hidden, unembed, preferred_element_type=jnp.float32)
    lp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]


def _fns(chunk_size: int):
    import jax
    import jax.numpy as jnp

    from dlc_jax.rl import token_logprobs

    def ours(h, w, y):
        tl = token_logprobs(h, w, y, chunk_size=chunk_size)
        return tl.lp, tl.entropy

    def ours_loss(h, w, y):
        return jnp.sum(ours(h, w, y)[0])

    def naive_loss(h, w, y):
        return jnp.sum(naive_logprobs(h, w, y))

    return {
        "ours_fwd": jax.jit(ours),
        "naive_fwd": jax.jit(naive_logprobs),
        "ours_fwd_bwd": jax.jit(jax.grad(ours_loss, argnums=(0, 1))),
        "naive_fwd_bwd": jax.jit(jax.grad(naive_loss, argnums=(0, 1))),
    }


def compiled_temp_bytes(fn, b: int, t: int, d: int, v: int) -> dict:
    """XLA memory analysis of ``fn(hidden [b,t,d], unembed [v,d], targets [b,t])``, not run."""
    import jax
    import jax.numpy as jnp

    sds = jax.ShapeDtypeStruct
    args = (sds((b, t, d), jnp.float32), sds((v, d), jnp.float32), sds((b, t), jnp.int32))
    m = fn.lower(*args).compile().memory_analysis()
    return {
        "temp": int(m.temp_size_in_bytes),
        "argument": int(m.argument_size_in_bytes),
        "output": int(m.output_size_in_bytes),
        "peak": int(getattr(m, "peak_memory_in_bytes", 0) or 0),
    }


def _total(an: dict) -> int:
    """Bytes live at the peak, bounded by arguments + outputs + temp (no aliasing here)."""
    return an["argument"] + an["output"] + an["temp"]


def linear_fit(x, y) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, R^2)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    ss = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss if ss > 0 else 1.0
    return float(a), float(b), r2


def run(cfg: LogprobBenchConfig = LogprobBenchConfig()) -> dict:
    import jax
    import jax.numpy as jnp

    res = common.new_result(
        "logprobs",
        f"Log-prob memory: chunked vs naive full softmax (V={cfg.vocab_size})",
        COLUMNS,
        cfg,
    )
    fns = _fns(cfg.chunk_size)
    d, v = cfg.hidden_size, cfg.vocab_size
    analyses = []
    for b, t in cfg.points:
        a = {k: compiled_temp_bytes(fn, b, t, d, v) for k, fn in fns.items()}
        analyses.append({"batch": b, "length": t, **a})
        row: dict = {"batch_x_length": f"{b} x {t}", "tokens": b * t}
        for what, ratio, ours, naive in (
            ("fwd", "fwd_ratio", a["ours_fwd"]["temp"], a["naive_fwd"]["temp"]),
            ("fwd_bwd", "fwd_bwd_ratio", a["ours_fwd_bwd"]["temp"], a["naive_fwd_bwd"]["temp"]),
            ("fwd_bwd_total", "total_ratio", _total(a["ours_fwd_bwd"]), _total(a["naive_fwd_bwd"])),
        ):
            row[f"ours_{what}_MiB"], row[f"naive_{what}_MiB"] = ours / MiB, naive / MiB
            row[ratio] = ours / naive
        res["rows"].append(row)
    res["analyses"] = analyses

    # correctness at a small point: ours computes the same numbers as the naive path
    cb, ct = cfg.check_point
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    h = jax.random.normal(k1, (cb, ct, d), jnp.float32)
    w = 0.05 * jax.random.normal(k2, (v, d), jnp.float32)
    y = jax.random.randint(k3, (cb, ct), 0, v)
    ours_lp = np.asarray(fns["ours_fwd"](h, w, y)[0])
    naive_lp = np.asarray(fns["naive_fwd"](h, w, y))
    res["check"] = {"point": [cb, ct], "max_abs_diff_lp": float(np.max(np.abs(ours_lp - naive_lp)))}

    tokens = [r["tokens"] for r in res["rows"]]
    # Fit over the multi-chunk points: with a single chunk XLA drops the loop and its carried [V,D]
    # gradient accumulator, so that point sits below the line.
    multi = [i for i, n in enumerate(tokens) if n > cfg.chunk_size]
    idx = multi if len(multi) >= 2 else list(range(len(tokens)))
    res["fit_points"] = [res["rows"][i]["batch_x_length"] for i in idx]
    fits = {}
    xs = [tokens[i] for i in idx]
    for key in ("ours_fwd", "ours_fwd_bwd", "naive_fwd", "naive_fwd_bwd"):
        for suffix, size in (("", lambda an: an["temp"]), ("_total", _total)):
            a0, slope, r2 = linear_fit(xs, [size(analyses[i][key]) for i in idx])
            fits[key + suffix] = {"intercept_bytes": a0, "bytes_per_token": slope, "r2": r2}
    res["linear_fits"] = fits
    last = res["rows"][-1]
    res["summary"] = {
        "fwd_ratio_at_largest": last["fwd_ratio"],
        "fwd_bwd_ratio_at_largest": last["fwd_bwd_ratio"],
        "total_ratio_at_largest": last["total_ratio"],
        "largest_point": last["batch_x_length"],
        "ours_temp_bytes_per_token": fits["ours_fwd_bwd"]["bytes_per_token"],
        "naive_temp_bytes_per_token": fits["naive_fwd_bwd"]["bytes_per_token"],
        "ours_total_r2_linear": fits["ours_fwd_bwd_total"]["r2"],
    }
    at = last["batch_x_length"]
    res["targets"] += [
        common.target(f"ours/naive {what}, {at}", last[key], 1 / 8, "<=")
        for what, key in (
            ("temp bytes, forward", "fwd_ratio"),
            ("temp bytes, fwd+bwd", "fwd_bwd_ratio"),
            ("args+outputs+temp, fwd+bwd", "total_ratio"),
        )
    ]
    r2 = fits["ours_fwd_bwd_total"]["r2"]
    res["targets"].append(
        common.target("ours fwd+bwd args+outputs+temp linear in tokens (R^2)", r2, 0.98, ">=")
    )
    fit_points = ", ".join(res["fit_points"])
    ours_temp = fits["ours_fwd_bwd"]["bytes_per_token"]
    ours_total = fits["ours_fwd_bwd_total"]
    naive_temp = fits["naive_fwd_bwd"]["bytes_per_token"]
    max_diff = res["check"]["max_abs_diff_lp"]
    res["notes"] += [
        f"compile-only XLA buffer assignment, D={d}, V={v}, f32; temp = scratch beyond "
        "arguments/outputs; total = arguments + outputs + temp (an upper bound on the live peak; "
        "includes the [V,D] unembedding and its gradient); ours = chunked token_logprobs (chunk "
        f"{cfg.chunk_size} positions, remat per chunk, lp + entropy)",
        f"growth per token (least squares over the multi-chunk points {fit_points}): ours temp "
        f"{ours_temp:.0f} B/token fwd+bwd (constant chunk scratch: it does not grow with B x T), "
        f"ours total {ours_total['bytes_per_token']:.0f} B/token (R^2 {ours_total['r2']:.4f}: "
        f"linear, the hidden states and their gradient); naive temp {naive_temp:.0f} B/token "
        "(the [B,T,V] f32 logits, log-softmax and gradient)",
        f"values checked at {cb} x {ct}: max |lp_ours - lp_naive| = {max_diff:.2e}",
    ]
    return common.finish(res)


ARGS = common.Options("logprobs", SIZES, ("--chunk-size", "chunk_size", {"type": int}))
add_args, from_args = ARGS.add_args, ARGS.from_args
