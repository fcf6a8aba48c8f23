"""Held-out outcome, scenario error statistics, paired differences with their power, the claims'
verdicts and summary.json: synthetic run results with hand-known answers."""

import json

import numpy as np
import pytest

from dlc_jax.experiments.evidence import (
    claim_verdicts,
    paired_heldout,
    scenario_error_stats,
    seeds_to_decide,
    summary_json,
)
from dlc_jax.experiments.results import RunResult
from dlc_jax.experiments.stats import learning_delta


def _held(start, end, n=4):
    """Per-prompt scores: the first start*n prompts right at step 0, end*n at the end."""
    s0 = [1.0 if i < round(start * n) else 0.0 for i in range(n)]
    s1 = [1.0 if i < round(end * n) else 0.0 for i in range(n)]
    return {
        "steps": [0, 5],
        "greedy": [start, end],
        "sampled": [float(np.mean(s0)), float(np.mean(s1))],
        "greedy_correct": [s0, s1],
        "sampled_correct": [s0, s1],
    }


def _run(name, arm, scenario, seed, held, delta=0.0, ell=0.0, cpu=100.0):
    return RunResult(
        name=name,
        arm=arm,
        scenario=scenario,
        steps=[1, 2],
        series={"delta_abs_mean": [delta, delta], "ell_abs_mean": [ell, 3 * ell]},
        seed=seed,
        heldout=held,
        info={"cpu_s": cpu},
    )


def test_learning_delta_is_paired_per_run_with_a_t_interval():
    up = [_held(0.25, 0.75), _held(0.25, 0.75), _held(0.25, 0.5)]
    iv = learning_delta(up)
    assert iv.point == pytest.approx((0.5 + 0.5 + 0.25) / 3) and iv.n == 3
    # t(0.975, 2) = 4.303, sd of (0.5, 0.5, 0.25) = 0.1443: half-width 0.3585
    assert (iv.lo, iv.hi) == pytest.approx((iv.point - 0.3585, iv.point + 0.3585), abs=1e-3)
    flat = learning_delta([_held(0.5, 0.5)] * 3)
    assert (flat.point, flat.lo, flat.hi) == (0.0, 0.0, 0.0)
    assert learning_delta([]).n == 0
    one = learning_delta([_held(0.25, 0.75)])
    assert one.point == 0.5 and np.isnan(one.lo) and "no interval" in one.fmt()


def test_seeds_to_decide_follows_the_normal_power_formula():
    # mean 0.1, sd 0.1: ((1.96 + 0.84) * 1)^2 = 7.85 -> 8 seeds
    assert seeds_to_decide([0.0, 0.1, 0.2]) == 8
    assert seeds_to_decide([0.1, 0.1, 0.1]) == 2  # no spread: the minimum
    assert seeds_to_decide([0.1, -0.1]) is None  # mean 0: no sample size decides it
    assert seeds_to_decide([0.3]) is None  # one seed: spread unmeasured


def test_paired_difference_uses_common_seeds_only():
    by_arm = {
        "dlc": [_run(f"d{s}", "dlc", "x", s, _held(0.5, e)) for s, e in ((0, 0.75), (1, 1.0))],
        "tis": [_run(f"t{s}", "tis", "x", s, _held(0.5, e)) for s, e in ((0, 0.5), (2, 0.0))],
    }
    iv, diffs = paired_heldout(by_arm, "dlc", "tis")
    assert diffs == [0.25] and iv.point == 0.25  # only seed 0 is in both arms


def test_difference_verdicts_name_identical_arms():
    from dlc_jax.experiments.evidence import verdict_of_difference

    same = {
        a: [_run(f"{a}{s}", a, "x", s, _held(0.5, 0.75)) for s in (0, 1, 2)] for a in ("dlc", "ppo")
    }
    iv, diffs = paired_heldout(same, "dlc", "ppo")
    assert diffs == [0.0, 0.0, 0.0] and verdict_of_difference(iv) == "identical on every seed"
    mixed = dict(
        same,
        ppo=[
            _run(f"p{s}", "ppo", "x", s, _held(0.5, e)) for s, e in ((0, 0.5), (1, 1.0), (2, 0.75))
        ],
    )
    assert verdict_of_difference(paired_heldout(mixed, "dlc", "ppo")[0]) == "inconclusive"
    up = dict(same, ppo=[_run(f"p{s}", "ppo", "x", s, _held(0.5, 0.25)) for s in (0, 1, 2)])
    assert verdict_of_difference(paired_heldout(up, "dlc", "ppo")[0]) == "higher"


def test_scenario_error_stats_average_over_runs_and_steps():
    runs = [_run("a", "tis", "x", 0, {}, delta=0.02, ell=0.1), _run("b", "tis", "x", 1, {})]
    st = scenario_error_stats(runs)
    assert st["delta_abs_mean"] == pytest.approx(0.01) and st["ell_abs_mean"] == pytest.approx(0.1)


CLAIMS = [
    "- **Noise threshold**: ...",
    "- Scenario `collapse`:",
    "  1. *DLC stays within 2x noise under the stale sampler*: **held** — max 1.2",
    "  2. *Importance weighting leaves the band once its ESS stays below 0.5*: **not held** — x",
    "  3. *DLC's resync prevents collapses*: **inconclusive** — y",
    "- Scenario `lag_never`:",
    "  1. *DLC stays within 2x noise under the stale sampler*: **held** — max 1.1",
    "  2. *Importance weighting leaves the band once its ESS stays below 0.5*: **held** — z",
]


def test_claim_verdicts_combine_scenarios():
    got = {c["claim"]: c for c in claim_verdicts(CLAIMS)}
    assert got[1]["verdict"] == "held" and "collapse: held (max 1.2)" in got[1]["evidence"]
    assert got[2]["verdict"] == "not held"  # not held in one scenario
    assert got[3]["verdict"] == "inconclusive"
    assert got[4] == {"claim": 4, "verdict": "inconclusive", "evidence": "not tested"}


def test_summary_has_the_issue_schema():
    refs = [_run(f"on{s}", "onpolicy", "reference", s, _held(0.25, 0.75)) for s in range(3)]
    tis = [_run(f"t{s}", "tis", "lag_never", s, _held(0.25, 0.5)) for s in (0, 1)]
    by_sc = {"lag_never": {"tis": tis}}
    out = summary_json(by_sc, refs, {}, {"lag_never": "lag"}, CLAIMS)
    json.dumps(out)  # serializable
    assert set(out) == {"onpolicy_learning", "scenarios", "claims", "heldout_overlap", "numerics"}
    assert set(out["onpolicy_learning"]) == {"delta", "lo", "hi", "seeds"}
    assert out["onpolicy_learning"]["delta"] == 0.5 and out["onpolicy_learning"]["seeds"] == 3
    sc = out["scenarios"]["lag_never"]
    assert sc["kind"] == "lag" and set(sc) == {
        "kind",
        "delta_abs_mean",
        "ell_abs_mean",
        "delta_abs_p99",
        "arms",
    }
    arm = sc["arms"]["tis"]
    assert arm["seeds"] == 2 and arm["heldout_acc"]["mean"] == 0.5
    assert set(arm["heldout_acc"]) == set(arm["max_ratio"]) == {"mean", "lo", "hi"}
    assert arm["max_ratio"]["mean"] is None  # no KL measured for it here
    assert [c["claim"] for c in out["claims"]] == [1, 2, 3, 4]
    assert all(c["verdict"] in ("held", "not held", "inconclusive") for c in out["claims"])


def test_report_and_summary_are_regenerated_byte_for_byte(tmp_path):
    from dlc_jax.experiments.presets import TINY
    from dlc_jax.experiments.report import write_report
    from dlc_jax.experiments.results import NoiseThreshold

    names = [f"onpolicy__s{i}" for i in range(3)]
    pairs = {f"{a}|{b}": [0.01, 0.02] for a in names for b in names if a != b}
    NoiseThreshold(steps=[5, 10], forward=[0.01, 0.02], reverse=[0.01, 0.02], pairs=pairs).save(
        tmp_path
    )
    for i, n in enumerate(names):
        r = _run(n, "onpolicy", "reference", i, _held(0.25, 0.75))
        r.kl_steps, r.kl_forward, r.kl_reverse = [5, 10], [0.01, 0.02], [0.01, 0.02]
        r.kl_by_ref = {m: [0.01, 0.02] for m in names if m != n}
        r.save(tmp_path)
        for arm, far in (("tis", 3.0), ("dlc", 1.0)):
            a = _run(f"collapse__{arm}__s{i}", arm, "collapse", i, _held(0.25, 0.5), 0.01, 0.2)
            a.kl_steps, a.kl_forward, a.kl_reverse = [5, 10], [0.01, 0.02 * far], [0.01, 0.02]
            a.kl_by_ref = {m: [0.01, 0.02 * far] for m in names if m != n}
            a.save(tmp_path)
    (tmp_path / "heldout_split.json").write_text('{"prompts": 64, "overlap": 0}')
    (tmp_path / "numerics.json").write_text(
        '{"jax_fp8_e4m3": {"delta_abs_mean": 0.0125, "delta_abs_p99": 0.195, "tokens": 889}}'
    )
    first = write_report(tmp_path, preset=TINY).read_bytes()
    summary = (tmp_path / "summary.json").read_bytes()
    assert write_report(tmp_path, preset=TINY).read_bytes() == first
    assert (tmp_path / "summary.json").read_bytes() == summary
    md, s = first.decode(), json.loads(summary)
    assert md.index("## At a glance") < md.index("## Scenario `collapse`")  # the first table
    assert "| collapse | both | 0.0100 | 0.4000 |" in md  # measured |delta| and |ell|
    assert s["onpolicy_learning"]["delta"] == 0.5
    assert s["scenarios"]["collapse"]["arms"]["tis"]["max_ratio"]["mean"] == pytest.approx(3.0)
    assert "- dlc - tis, final held-out greedy accuracy paired over 3 seeds" in md
    # the v3 keys (issue 32 item 7)
    assert s["heldout_overlap"] == 0 and s["numerics"]["jax_fp8_e4m3"]["delta_abs_p99"] == 0.195
    assert "| jax_fp8_e4m3 | 0.0125 | 0.1950 |" in md
    tis = s["scenarios"]["collapse"]["arms"]["tis"]
    assert tis["resyncs"] == {"mean": None, "min": None} and tis["acc_per_kcpu_s"] == 2.5
    assert tis["dlc_minus"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert s["scenarios"]["collapse"]["delta_abs_p99"] is None  # not logged by these runs
    assert all("bootstrap over runs" in c["interval_method"] for c in s["claims"])


def test_sweep_table_has_one_row_per_point_with_the_learning_interval():
    from dlc_jax.experiments.sweep import sweep_table

    def row(point, seed, end, cpu):
        return {
            "point": point,
            "seed": seed,
            "lr": 5e-5,
            "batch_prompts": 8,
            "n": 8,
            "steps": 20,
            "heldout": _held(0.25, end),
            "entropy_first": 0.3,
            "entropy_last": 0.2,
            "entropy_max": 0.35,
            "cpu_s": cpu,
            "loadavg": "1.5 1.0 0.5",
        }

    rows = [row("a", 0, 0.75, 40.0), row("a", 1, 0.75, 60.0), row("b", 0, 0.25, None)]
    lines = sweep_table(rows)
    assert len(lines) == 4 and lines[2].startswith("| a | 5e-05 | 8 x 8 | 20 | 2 |")
    # half the prompts gained in both runs: no spread over runs
    assert "| 0.250 -> 0.750 | 0.500 [0.500, 0.500] |" in lines[2]
    assert lines[2].endswith("| 0.30 -> 0.20 (0.35) | 50 (1.5) |")
    assert lines[3].endswith("| — (1.5) |")  # CPU-s not recorded


def test_seeds_from_interval_scales_the_half_width():
    from dlc_jax.experiments.evidence import Z_80, Z_95, seeds_from_interval
    from dlc_jax.experiments.stats import Interval

    # half-width 0.5, gap 0.5 to the band: k = ((z95 + z80) / z95)^2 = 2.04 -> 3 seeds x 2.04 -> 7
    iv = Interval(1.5, 1.0, 2.0, 3)
    assert seeds_from_interval(iv, 2.0) == int(np.ceil(3 * ((Z_95 + Z_80) / Z_95) ** 2)) == 7
    assert seeds_from_interval(Interval(2.0, 1.5, 2.5, 3), 2.0) is None  # on the band
    assert seeds_from_interval(Interval(1.0, 0.99, 1.01, 3), 2.0) == 3  # already decided
