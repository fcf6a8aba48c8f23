"""A tiny Qwen3-MoE train step and theta_s forward AOT-compiled for 4 abstract TPU chips (v5e 2x2)
with an `expert` mesh axis of 2 (fsdp 2 x expert 2) and `moe_dispatch: all_to_all`
(dlc_jax/plan/moe_ep.py): moe_impl=auto resolves to the megablox grouped matmul, the token
exchange compiles to XLA's ragged-all-to-all (it has no CPU lowering: this is its only compile
here), and XLA's FLOPs count of both programs is close to the plan's analytic prediction (with
ragged_dot, which the TPU compiler lowers densely, the 30B-A3B plan's count was 18x the
prediction: docs/bench/PLAN.md). The figures of every dispatch and mesh: docs/bench/moe_ep.md."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

# a subprocess: libtpu is loaded before JAX picks its backends
COMPILE = """
import json
from dlc_jax.plan.moe_ep import compile_tiny_moe
print(json.dumps(compile_tiny_moe("v5e:2x2", fsdp=2, expert=2, dispatch="all_to_all")))
"""


def test_tiny_moe_expert_parallel_all_to_all_compiles_for_tpu():
    env = {**os.environ, "TPU_STDERR_LOG_LEVEL": "3", "TPU_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["impl"] == "megablox" and got["mesh"]["expert"] == 2
    for name, prog in got["programs"].items():
        print(name, {k: v for k, v in prog.items() if k != "compile_cpu_s"})
        assert prog["collective_bytes"].get("ragged-all-to-all", 0) > 0, name
        assert 0.67 < prog["xla_flops"] / prog["pred_flops"] < 2.0, (name, prog)
        assert 0 < prog["peak_bytes"] < 64 << 20, (name, prog)
    assert got["dispatch_bytes_per_layer"]["ratio"] < 1.0
