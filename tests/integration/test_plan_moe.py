"""dlc-jax plan for a tiny Qwen3-MoE (subprocess, as a user runs it): the model family comes from
config.json, the step replays routed experts (moe.router_replay: sampler), and it AOT-compiles for
a v5litepod-4 slice with ragged_dot experts."""

import json
import subprocess
import sys

import pytest

from dlc_jax.model.config import Qwen3MoeConfig
from dlc_jax.plan.moe_ep import TINY_MOE

pytestmark = pytest.mark.slow

MOE = TINY_MOE  # the tiny Qwen3-MoE the expert-parallel plan compiles (dlc_jax.plan.moe_ep)


def test_tiny_moe_plan_with_router_replay(tmp_path):
    model = tmp_path / "tiny_moe"
    model.mkdir()
    cfg = Qwen3MoeConfig(**MOE)
    (model / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    (tmp_path / "cfg.yaml").write_text(
        f"""
model: {{path: {model}, param_dtype: float32, compute_dtype: bfloat16, remat: true}}
mesh: {{data: 1, fsdp: -1, tensor: 1}}
moe: {{router_replay: sampler}}
sampler: {{n: 4, head_k: 4, max_model_len: 128}}
train: {{batch_prompts: 4, micro_batches: 2}}
resync: {{max_snapshots: 2}}
"""
    )
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlc_jax.cli",
            "plan",
            "--config",
            str(tmp_path / "cfg.yaml"),
            "--topology",
            "v5litepod-4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    c = r["config"]
    assert r["fits"] is True and c["model_type"] == "qwen3_moe" and c["experts"] == "2 of 8"
    # all 8 experts' weights are parameters; a token multiplies 2 of them
    experts = 2 * 8 * 3 * 64 * 32
    assert c["params"] >= experts and c["active_matmul_params"] < c["params"] - experts // 2
    a = r["analytic_flops"]
    assert a["matmul_params"] == c["active_matmul_params"] + 512 * 64
    assert "experts 2 of 8" in proc.stdout
