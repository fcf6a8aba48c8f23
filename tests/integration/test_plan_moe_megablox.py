"""A tiny Qwen3-MoE train step AOT-compiled for 4 abstract TPU chips with moe_impl=auto runs its
experts as the megablox grouped matmul (dlc_jax/model/moe_dispatch.py): it compiles, and XLA's
FLOPs count of it is close to the plan's analytic prediction (with ragged_dot, which the TPU
compiler lowers densely, the 30B-A3B plan's count was 18x the prediction: docs/bench/PLAN.md)."""

import json
import os
import subprocess
import sys

import pytest

from dlc_jax.model.config import Qwen3MoeConfig

pytestmark = pytest.mark.slow

MOE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
)

# a subprocess: libtpu is loaded before JAX picks its backends
COMPILE_STEP = """
import json, sys
import jax
from dlc_jax.model.moe_dispatch import resolve_moe_impl
from dlc_jax.plan.abstract_state import abstract_run, model_config, plan_mesh
from dlc_jax.plan.compile import compile_program
from dlc_jax.plan.flops import StepShape, step_flops
from dlc_jax.plan.topology import abstract_devices, parse_topology
from dlc_jax.trainer.config import load_config
from dlc_jax.trainer.step import make_train_step, step_config
cfg = load_config(sys.argv[1], [])
topo = parse_topology("v5e:2x2", 1)
mesh, _ = plan_mesh(cfg.mesh, abstract_devices(topo), 1)
run = abstract_run(cfg, mesh)
scfg = step_config(cfg)
shard = lambda t: jax.tree.map(lambda x: x.sharding, t)
step = make_train_step(run.graphdef, run.tx, scfg, mesh=mesh, param_shardings=shard(run.params),
                       opt_shardings=shard(run.opt_state))
rep = compile_program("train_step", step, run.params, run.opt_state, run.batch)
qc = model_config(cfg.model)
shape = StepShape(rows=cfg.train.batch_prompts * cfg.sampler.n, seq_len=cfg.sampler.max_model_len,
                  micro_batches=cfg.train.micro_batches, chunk_size=scfg.chunk_size, chips=4,
                  remat_policy=run.model.remat_policy, scanned_layers=bool(run.model.scanned),
                  pallas_attention=True, fsdp=mesh.shape["fsdp"], slices=1)
pred = step_flops(qc, shape)["xla_visible_train_step_per_device"]
print(json.dumps({"xla": rep.xla_flops, "pred": pred, "impl": resolve_moe_impl(qc.moe_impl, mesh),
                  "peak": rep.peak_bytes, "temp": rep.temp_bytes}))
"""


def test_tiny_moe_train_step_compiles_with_megablox_and_counts_close(tmp_path):
    model = tmp_path / "tiny_moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(Qwen3MoeConfig(**MOE).to_hf_dict()))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {model}, param_dtype: float32, compute_dtype: bfloat16, remat: true,
        scan_layers: true}}
mesh: {{data: 1, fsdp: -1, tensor: 1}}
sampler: {{n: 4, head_k: 4, max_model_len: 128}}
train: {{batch_prompts: 4, micro_batches: 2}}
resync: {{max_snapshots: 1}}
"""
    )
    env = {**os.environ, "TPU_STDERR_LOG_LEVEL": "3", "TPU_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE_STEP, str(cfg)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print("megablox train step:", got)  # the numbers in docs/bench/PLAN.md (load-independent)
    assert got["impl"] == "megablox"
    assert 0.67 < got["xla"] / got["pred"] < 1.5, got
