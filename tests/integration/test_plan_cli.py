"""dlc-jax plan end to end (subprocess, as a user runs it): a tiny config AOT-compiled for a
v5litepod-4 slice and for 2 slices of it, and a config that does not fit exits 1 with one line.

libtpu describes the TPU devices and compiles for them on this CPU; nothing runs on a TPU.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

TINY = """
model: {path: "", preset: tiny, param_dtype: float32, compute_dtype: bfloat16, remat: true}
mesh: {data: 1, fsdp: -1, tensor: 1}
sampler: {n: 4, head_k: 4, max_model_len: 128}
train: {batch_prompts: 4, micro_batches: 2}
resync: {max_snapshots: 2}
"""

GIB = 1 << 30


def _plan(
    tmp_path: Path, *args: str, config: str = TINY
) -> tuple[subprocess.CompletedProcess, dict]:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(config)
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlc_jax.cli",
            "plan",
            "--config",
            str(cfg),
            "--json",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc, (json.loads(out.read_text()) if out.exists() else {})


def _check_fits(r: dict, chips: int) -> None:
    assert r["fits"] is True and r["topology"]["chips"] == chips
    step = r["programs"]["train_step"]
    # peak of a program = arguments + outputs + temporaries; the step's arguments are theta_t, the
    # optimizer state and the batch, which the plan also counts itself from the shardings (XLA's
    # figure is larger by TPU tile padding: the tiny model's 32-wide head dims pad to 128)
    assert step["peak_bytes"] == (
        step["argument_bytes"] + step["output_bytes"] + step["temp_bytes"] - step["alias_bytes"]
    )
    res = r["resident_bytes_per_chip"]
    counted = res["params"] + res["optimizer_state"] + res["batch"]
    assert counted <= step["argument_bytes"] < 1.5 * counted
    assert (
        counted - res["batch"] <= step["output_bytes"] < 1.5 * counted
    )  # new theta_t + optimizer state
    assert res["theta_s_snapshots"] == 2 * res["params"]  # resync.max_snapshots copies
    assert r["peak_bytes_per_chip"]["total"] == max(
        r["peak_bytes_per_chip"]["train_step_phase"],
        r["peak_bytes_per_chip"]["snapshot_forward_phase"],
    )
    assert r["hbm_bytes_per_chip"] == int(15.75 * GIB)  # v5e, as libtpu's compiler limits it
    # 16 rows x 128 tokens; 6 N tokens with N = decoder matmul params + the vocabulary projection
    a = r["analytic_flops"]
    assert a["tokens"] == 16 * 128 and a["six_n_tokens"] == 6 * a["matmul_params"] * 16 * 128
    # XLA's count matches the analytic count under XLA's rules (loop bodies once, Pallas = 0)
    # (or, when a micro-batch has fewer positions per chip than one log-prob chunk, with the chunk
    # computed whole on every chip; the plan says which)
    xla = r["xla_flops_per_device"]["train_step"]
    pred = a[
        "xla_visible_train_step_per_device"
        + ("_chunks_replicated" if r["logprob_chunks_replicated"] else "")
    ]
    assert 0.8 < xla / pred < 1.3, r["flops_note"]
    assert 0 < r["mfu"] < 1 and r["projected_step_s"] > 0 and r["compile_s"] > 0


@pytest.mark.slow
def test_tiny_plan_on_v5litepod_4(tmp_path):
    proc, r = _plan(tmp_path, "--topology", "v5litepod-4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check_fits(r, 4)
    assert r["topology"]["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    # no verdict line on stderr (it may hold environment warnings from JAX/libtpu)
    assert "fits: yes" in proc.stdout and "dlc-jax plan:" not in proc.stderr


@pytest.mark.slow
def test_tiny_plan_on_two_slices(tmp_path):
    proc, r = _plan(tmp_path, "--topology", "v5e:2x2", "--slices", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check_fits(r, 8)
    # data parallel over the slices (DCN), FSDP inside a slice (ICI)
    assert (
        r["topology"]["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
        and r["topology"]["slices"] == 2
    )
    assert r["topology"]["data_axis_spans_slices"] is True


def test_plan_that_does_not_fit_exits_1_with_one_line(tmp_path):
    """4,096 rows x 16,384 tokens in one micro-batch: the TPU compiler runs out of HBM; the plan
    catches RESOURCE_EXHAUSTED and says by how much and what to change."""
    big = (
        TINY.replace("max_model_len: 128", "max_model_len: 16384")
        .replace("n: 4,", "n: 8,")
        .replace("batch_prompts: 4, micro_batches: 2", "batch_prompts: 512, micro_batches: 1")
    )
    proc, r = _plan(tmp_path, "--topology", "v5litepod-4", config=big)
    assert proc.returncode == 1, proc.stderr[-2000:]
    # exactly one verdict line, the last thing on stderr (JAX/libtpu may warn about the environment)
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("dlc-jax plan:")]
    assert len(lines) == 1 and proc.stderr.strip().endswith(lines[0]), proc.stderr
    line = lines[0]
    assert line.startswith("dlc-jax plan: does not fit on v5litepod-4") and "over by" in line
    assert "train.micro_batches=" in line and "larger --topology" in line
    assert r["fits"] is False and "RESOURCE_EXHAUSTED" in r["programs"]["train_step"]["oom"]
    assert r["peak_bytes_per_chip"]["total"] > r["hbm_bytes_per_chip"]


def test_bad_topology_exits_2(tmp_path):
    proc, _ = _plan(tmp_path, "--topology", "v5p-12")
    assert proc.returncode == 2 and "v5p-12" in proc.stderr
