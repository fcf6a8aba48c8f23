"""One trainer process of tests/e2e/test_lora_multihost_push.py (run as a script, one per JAX
process; `jax.distributed` settings from the JAX_* environment): the tiny model over a (fsdp x
tensor=2) mesh of every process's devices, rank-4 adapters with non-zero factors (the same values on
every process, sharded like their kernels), then the collective adapter pushes of a multi-host run:

1. version 1 through `adapter_pusher(multi=True)` (every process gathers, process 0 pushes);
2. version 2 claiming another base: refused by the sampler, and every process must see it.

Writes its results (one JSON file) and the adapter it gathered (PEFT directory) under --out."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

RANK, ALPHA = 4, 8.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import jax
    import numpy as np
    from flax import nnx

    from dlc_jax.lora import LoraConfig, LoraParam, apply_lora
    from dlc_jax.lora.export import save_peft
    from dlc_jax.model import MeshConfig, load_hf, make_mesh
    from dlc_jax.sampler.client.client import SamplerClient
    from dlc_jax.trainer import distributed as dist
    from dlc_jax.trainer.config_sections import DistributedSection
    from dlc_jax.trainer.lora_push import adapter_pusher

    info = dist.initialize(DistributedSection())
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=2), jax.devices())
    model = load_hf(args.model_dir, mesh=mesh)
    cfg = LoraConfig(rank=RANK, alpha=ALPHA, push="adapter")
    apply_lora(model, cfg)
    sharded = 0
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(model, LoraParam))):
        x = v.get_value()  # "trained" factors: B non-zero, a visible change of the policy
        host = (0.05 * np.random.default_rng(i).standard_normal(x.shape)).astype(np.float32)
        sharded += int(not x.is_fully_addressable)
        v.set_value(jax.make_array_from_callback(x.shape, x.sharding, lambda idx, h=host: h[idx]))
    out = pathlib.Path(args.out)
    save_peft(model, cfg, out / f"adapter_p{info.process_index}")  # a collective gather
    pusher = adapter_pusher(cfg, multi=True, backend="jax")
    foreign = adapter_pusher(cfg, multi=True, backend="jax")
    foreign._base = "0" * 16  # an adapter trained on another base
    rows = []
    with SamplerClient(args.address, timeout=300) as client:
        client.wait_ready(120)
        for pu, version in ((pusher, 1), (foreign, 2)):
            r = pu.push(client, model, version)
            rows.append(
                {
                    "ok": r.ok,
                    "version": r.version,
                    "message": r.message,
                    "code": r.code,
                    "egress_bytes": r.egress_bytes,
                }
            )
    result = {
        "process": info.process_index,
        "processes": info.process_count,
        "pusher": type(pusher).__name__,
        "factors_not_fully_addressable": sharded,
        "pushes": rows,
    }
    (out / f"p{info.process_index}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
