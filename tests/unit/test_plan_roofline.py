"""The plan's roofline (dlc_jax.plan.roofline) and the HLO readings it uses (collective bytes,
collective-matmul loops), on hand-made inputs."""

import pytest

from dlc_jax.plan.chips import CHIPS
from dlc_jax.plan.compile import collective_bytes, windowed_loops
from dlc_jax.plan.roofline import program_roofline, roofline

V5P = CHIPS["v5p"]


def test_each_program_takes_its_largest_time_and_the_bytes_are_loop_scaled():
    # XLA saw 1e12 of 4e12 FLOPs (loop bodies once): its 1e11 bytes stand for 4e11
    prog = {"xla_flops": 1e12, "xla_bytes_accessed": 1e11}
    r = program_roofline("p", 4e12, prog, 2e12, V5P, 0.0)
    assert r["loop_scale"] == 4.0 and r["hbm_bytes_per_chip"] == 4e11
    assert r["seconds"]["compute"] == pytest.approx(4e12 / 459e12, rel=1e-3)
    assert r["seconds"]["memory"] == pytest.approx(4e11 / 2765e9, rel=1e-3)
    assert r["bound"] == "memory" and r["projected_s"] == pytest.approx(4e11 / 2765e9, rel=1e-3)
    # XLA counting more than the rules predict (megablox's estimate): scaled from the prediction;
    # FLOPs XLA cannot see (splash) stay out of the scale
    over = program_roofline("p", 4e12, {"xla_flops": 8e12, "xla_bytes_accessed": 1e9}, 2e12, V5P, 0)
    assert over["loop_scale"] == 2.0
    splash = program_roofline("p", 4e12, prog, 2e12, V5P, 0.0, unseen_flops=2e12)
    assert splash["loop_scale"] == 2.0
    ici = program_roofline("p", 1e9, {"xla_flops": 1e9}, 1e9, V5P, 1.2e12)
    assert ici["bound"] == "collective" and ici["projected_s"] == pytest.approx(1.0)


def _result() -> dict:
    prog = {"xla_flops": 1e12, "xla_bytes_accessed": 1e10, "peak_bytes": 1, "temp_bytes": 1}
    fl = {
        "hardware_flops": 8 * 5e12,
        "snapshot_forward": 8 * 1e12,
        "model_flops": 8 * 4e12,
        "attention": 0.0,
        "xla_visible_train_step_per_device": 1e12,
        "xla_visible_snapshot_forward_per_device": 0.5e12,
    }
    return {
        "analytic_flops": fl,
        "topology": {"chips": 8, "mesh": {"data": 1, "fsdp": 8, "tensor": 1}},
        "config": {"params": 10**9, "compute_dtype": "bfloat16", "attention": "dense"},
        "programs": {"train_step": dict(prog), "snapshot_forward": dict(prog, xla_flops=0.5e12)},
    }


def test_the_step_is_the_train_step_plus_the_theta_s_forward():
    r = roofline(_result(), V5P)
    step, fwd = r["programs"]["train_step"], r["programs"]["snapshot_forward"]
    assert step["flops_per_chip"] == 4e12 and fwd["flops_per_chip"] == 1e12
    # FSDP over 8: two bf16 weight gathers + one f32 gradient reduce-scatter, 7/8 arriving
    assert step["collective_bytes_per_chip"] == pytest.approx(7 / 8 * (2 * 2e9 + 4e9))
    assert fwd["collective_bytes_per_chip"] == pytest.approx(7 / 8 * 2e9)
    assert r["step_s"] == pytest.approx(step["projected_s"] + fwd["projected_s"])
    assert r["mfu"] == pytest.approx(8 * 4e12 / (r["step_s"] * 459e12 * 8))


def test_hlo_readings():
    hlo = (
        "  %ag = (bf16[2,4]{1,0}, bf16[16,4]{1,0}) all-gather-start(%x), dimensions={0}\n"
        "  %d = bf16[16,4]{1,0} all-gather-done(%ag)\n"
        "  %y = f32[8]{0} all-reduce(%z), to_apply=%add\n"
        "  %w = f32[4]{0} reduce-scatter(%y), dimensions={0}\n"
        "  %l = (s32[], f32[8]) while(%t), body=%windowed_dot_general_body_ag.3\n"
    )
    assert collective_bytes(hlo) == {"all-gather": 128, "all-reduce": 32, "reduce-scatter": 16}
    assert windowed_loops(hlo) == 1 and windowed_loops("no loops") == 0


def test_hlo_readings_count_the_ragged_all_to_all():
    hlo = (
        "  %r = f32[64,8]{1,0} ragged-all-to-all(%x, %o, %a, %b, %c, %d)\n"
        "  %t = f32[4,8]{1,0} all-to-all(%y), dimensions={0}\n"
    )
    assert collective_bytes(hlo) == {"ragged-all-to-all": 2048, "all-to-all": 128}
