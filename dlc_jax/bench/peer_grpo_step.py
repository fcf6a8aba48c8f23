"""tunix's GRPO learner step (``grpo_loss_fn``, beta = 0, its FSDP-sharded Qwen3; our AdamW and TPU
flags) AOT-compiled for a TPU slice on this CPU, the peer of `dlc-jax bench plan-peers`. With tunix
on ``PYTHONPATH``: ``python -m dlc_jax.bench.peer_grpo_step MODEL TOPOLOGY ROWS SEQ_LEN OUT.json``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

PROMPT_TOKENS = 512  # of each row's SEQ_LEN; the rest is the completion


def compile_peer(model: str, topology: str, rows: int, seq_len: int) -> dict:
    from dlc_jax import tpu_flags

    flags = tpu_flags.apply()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from tunix.models.qwen3 import model as tq
    from tunix.rl import algo_core
    from tunix.rl.grpo.grpo_learner import GRPOConfig, TrainExample

    from dlc_jax.plan.compile import collective_bytes, windowed_loops
    from dlc_jax.plan.hlo_bytes import RULES, loop_weighted_bytes
    from dlc_jax.plan.topology import abstract_devices, parse_topology
    from dlc_jax.trainer.state import opt_state_shardings

    topo = parse_topology(topology)
    devices = abstract_devices(topo)
    mesh = jax.sharding.Mesh(np.asarray(devices).reshape(len(devices), 1), ("fsdp", "tp"))
    make = {"0.6B": tq.ModelConfig.qwen3_0p6b, "1.7B": tq.ModelConfig.qwen3_1p7b}
    cfg = make[model.split(":")[0]]()
    if ":" in model:  # "0.6B:2": the same model with 2 layers (a quick check of the program)
        cfg.num_layers = int(model.split(":")[1])
    cfg.remat_config = tq.RematConfig.DECODER
    cfg.dtype = jnp.bfloat16
    cfg.param_dtype = jnp.float32
    cfg.use_flash_attention = True
    with mesh:
        abstract = nnx.eval_shape(lambda: tq.Qwen3(cfg, rngs=nnx.Rngs(0)))
        graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)  # type: ignore[misc]
        specs = nnx.get_partition_spec(params)
        shard = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)

        def placed(x, s):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

        params = jax.tree.map(placed, params, shard)
        tx = optax.chain(
            optax.clip_by_global_norm(1.0), optax.adamw(1e-6, b1=0.9, b2=0.999, weight_decay=0.01)
        )
        opt_shape = jax.eval_shape(tx.init, params)
        opt_sh = opt_state_shardings(tx, params, shard, mesh)  # as our trainer places it
        opt_state = jax.tree.map(placed, opt_shape, opt_sh)
        rows_sh = NamedSharding(mesh, P("fsdp"))
        comp = seq_len - PROMPT_TOKENS

        def arr(shape, dt):
            return jax.ShapeDtypeStruct(shape, dt, sharding=rows_sh)

        example = TrainExample(
            prompt_ids=arr((rows, PROMPT_TOKENS), jnp.int32),
            prompt_mask=arr((rows, PROMPT_TOKENS), jnp.int32),
            completion_ids=arr((rows, comp), jnp.int32),
            completion_mask=arr((rows, comp), jnp.int32),
            advantages=arr((rows,), jnp.float32),
            ref_per_token_logps=None,
            old_per_token_logps=arr((rows, comp), jnp.float32),
        )
        algo = GRPOConfig(num_generations=8, beta=0.0)
        if not hasattr(algo, "temperature"):  # google-tunix 0.1.7's loss reads it; config lacks it
            algo.temperature = 1.0

        def step(p, o, ex):
            def loss_of(p):
                m = nnx.merge(graphdef, p, rest)
                loss, _ = algo_core.grpo_loss_fn(m, ex, algo, pad_id=0, eos_id=1)
                return loss

            loss, grads = jax.value_and_grad(loss_of)(p)
            updates, o = tx.update(grads, o, p)
            return optax.apply_updates(p, updates), o, loss

        jitted = jax.jit(step, out_shardings=(shard, opt_sh, None), donate_argnums=(0, 1))
        t0, c0 = time.perf_counter(), time.process_time()
        out: dict = {"model": model, "topology": topo.name, "rows": rows, "seq_len": seq_len}
        try:
            compiled = jitted.lower(params, opt_state, example).compile()
        except Exception as e:  # noqa: BLE001 - the TPU compiler's out-of-HBM error
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            line = next(ln for ln in str(e).splitlines() if "RESOURCE_EXHAUSTED" in ln)
            out.update(oom=line[:300], compile_s=time.perf_counter() - t0, xla_flags=flags)
            return out
    mem: Any = compiled.memory_analysis()
    cost: Any = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, (list, tuple)) else (cost or {})
    hlo = compiled.as_text() or ""
    out.update(
        compile_s=time.perf_counter() - t0,
        compile_cpu_s=time.process_time() - c0,
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes),
        temp_bytes=int(mem.temp_size_in_bytes),
        xla_flops=float(cost.get("flops", 0.0)),
        xla_bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        collective_bytes=collective_bytes(hlo),
        windowed_einsum_loops=windowed_loops(hlo),
        # the same HBM rule as ours (plan.roofline): loop bodies weighted by their trip counts
        **{f"hlo_bytes_{k}": v for k, v in loop_weighted_bytes(hlo).items()},
        hlo_bytes_rules=RULES,
        params=int(sum(x.size for x in jax.tree.leaves(params))),
        xla_flags=flags,
        chips=topo.chips,
        fsdp=topo.chips,
        chip=topo.chip.generation,
    )
    out["peak_bytes"] = (
        out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    )
    return out


def main(argv: list[str]) -> int:
    model, topology, rows, seq_len, path = argv
    r = compile_peer(model, topology, int(rows), int(seq_len))
    with open(path, "w") as f:
        json.dump(r, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
