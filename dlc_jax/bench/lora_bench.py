"""LoRA pushes: an adapter push (`AdapterPusher`, merged by the sampler into its base) vs the full
push of the merged model (gRPC and socket data plane) to a JAX sampler process on loopback; each row
times the whole resync path, and rows measured above ``MAX_LOAD`` are marked unreliable.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import tempfile

from dlc_jax.bench import common

MAX_LOAD = 2.0  # a wall time measured at a higher 1-minute load average is not a result

COLUMNS = [
    "path",
    "seconds",
    "median_s",
    "MB",
    "bytes_vs_full",
    "seconds_vs_full",
    "trainer_cpu_s",
    "sampler_cpu_s",
    "load_1m",
    "reliable",
]


@dataclasses.dataclass(frozen=True)
class LoraBenchConfig(common.BenchShape):
    """Model shapes (random weights), adapter rank / alpha, push dtype, repeats."""

    rank: int = 8
    alpha: float = 16.0
    push_dtype: str = "bfloat16"
    repeats: int = 3


SIZES = {
    "small": LoraBenchConfig(**common.shape("qwen3_0p6b", vocab_size=32768, num_hidden_layers=4)),
    "qwen3_0p6b": LoraBenchConfig(**common.shape("qwen3_0p6b")),
    "tiny": LoraBenchConfig(**common.shape("tiny"), rank=4, repeats=2),
}

FULL_GRPC = "full push, merged (gRPC)"
FULL_SOCKET = "full push, merged (socket data plane)"
ADAPTER = "adapter push (gRPC)"


def random_adapters(model, lcfg, scale: float):
    """``model`` with ``lcfg``'s adapters applied in place, factors N(0, 1) x ``scale``."""
    import jax
    from flax import nnx

    from dlc_jax.lora import LoraParam, apply_lora

    apply_lora(model, lcfg)
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(model, LoraParam))):
        x = v.get_value()
        v.set_value(scale * jax.random.normal(jax.random.key(i), x.shape, x.dtype))
    return model


def run(cfg: LoraBenchConfig = SIZES["small"]) -> dict:
    from flax import nnx

    from dlc_jax.lora import LoraConfig, merged_model
    from dlc_jax.lora.push import AdapterPusher
    from dlc_jax.model import Qwen3ForCausalLM, load_hf, save_hf
    from dlc_jax.sampler.service.process import SamplerProcess

    title = "LoRA pushes: adapter push vs full (merged) push of the same model"
    res = common.new_result("lora", title, COLUMNS, cfg)
    with tempfile.TemporaryDirectory(prefix="dlc_lora_bench_") as d:
        tmp = pathlib.Path(d)
        base = Qwen3ForCausalLM(cfg.model_config(), rngs=nnx.Rngs(0))
        base_dir = pathlib.Path(save_hf(base, tmp / "base", dtype=cfg.push_dtype))
        del base
        # the trainer's model: the base loaded back, adapters with B non-zero (a trained adapter)
        lcfg = LoraConfig(rank=cfg.rank, alpha=cfg.alpha, push="adapter")
        model = random_adapters(load_hf(str(base_dir)), lcfg, 1e-3)
        pusher = AdapterPusher(lcfg)
        args = ["--dtype", cfg.push_dtype, "--max-model-len", "64", "--push-data-port", "0"]
        log = str(tmp / "sampler.log")
        srv = SamplerProcess("jax", str(base_dir), extra_args=args, log_file=log).start()
        client = srv.client(timeout=3600)
        assert srv.proc is not None  # started
        pid = srv.proc.pid
        versions = itertools.count(1)

        def full(transport: str):
            return client.push_model(
                merged_model(model), next(versions), dtype=cfg.push_dtype, transport=transport
            )

        paths = {
            FULL_GRPC: lambda: full("grpc"),
            FULL_SOCKET: lambda: full("socket"),
            ADAPTER: lambda: pusher.push(client, model, next(versions), dtype=cfg.push_dtype),
        }
        times: dict[str, list[float]] = {k: [] for k in paths}
        cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}  # trainer, sampler
        loads: dict[str, list[float]] = {k: [] for k in paths}
        nbytes: dict[str, int] = {}
        try:
            for fn in paths.values():  # warm-up: compiles the merge, the export, the adapter merge
                common.accepted(fn())
            for _ in range(cfg.repeats):
                for k, fn in paths.items():
                    loads[k].append(os.getloadavg()[0])
                    r, wall, me, sampler_cpu = common.measure(fn, [pid])
                    times[k].append(wall)
                    cpu[k].append((me, sampler_cpu or 0.0))
                    loads[k].append(os.getloadavg()[0])
                    nbytes[k] = int(common.accepted(r).bytes)
        finally:
            client.close()
            srv.stop()
    ref_s = common.best(times[FULL_GRPC])
    for k in paths:
        load = max(loads[k])
        res["rows"].append(
            {
                "path": k,
                "seconds": common.best(times[k]),
                "median_s": common.median(times[k]),
                "MB": nbytes[k] / 1e6,
                "bytes_vs_full": nbytes[k] / nbytes[FULL_GRPC],
                "seconds_vs_full": common.best(times[k]) / ref_s,
                "trainer_cpu_s": common.median(c for c, _ in cpu[k]),
                "sampler_cpu_s": common.median(s for _, s in cpu[k]),
                "load_1m": load,
                "reliable": load <= MAX_LOAD,
            }
        )
    a = res["rows"][-1]
    res["summary"] = {
        "adapter_bytes": nbytes[ADAPTER],
        "full_bytes": nbytes[FULL_GRPC],
        "adapter_bytes_vs_full": a["bytes_vs_full"],
        "adapter_seconds_vs_full": a["seconds_vs_full"],
        "adapter_seconds_reliable": all(r["reliable"] for r in res["rows"]),
    }
    res["times"], res["cpu"], res["loads"] = times, cpu, loads
    res["targets"].append(
        common.target("adapter push bytes / full push bytes", a["bytes_vs_full"], 0.01, "<=")
    )
    res["notes"] += [
        f"rank {cfg.rank} on every attention and MLP projection, {cfg.push_dtype} pushes, "
        f"{cfg.repeats} interleaved repeats after one warm-up each; seconds = fastest repeat of "
        "the trainer's whole resync path (merge/gather, export, push, the sampler's swap)",
        "bytes and CPU seconds are load-independent; seconds are not: rows whose 1-minute load "
        f"average exceeded {MAX_LOAD:g} while they ran are marked reliable=no (not a result)",
    ]
    return common.finish(res)


ARGS = common.Options(
    "lora",
    SIZES,
    ("--repeats", "repeats", {"type": int}),
    ("--rank", "rank", {"type": int, "help": "adapter rank (default 8)"}),
    ("--push-dtype", "push_dtype", {"choices": ["float32", "bfloat16"]}),
)
add_args, from_args = ARGS.add_args, ARGS.from_args
