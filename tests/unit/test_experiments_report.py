"""Report numbers come from the run outputs: synthetic results with hand-known answers."""

import math

import numpy as np
import pytest

from dlc_jax.experiments.analysis import (
    AnalysisConfig,
    distance_ratio,
    first_below,
    fit_lag_variance,
    predicted_crossing,
    solve_crossing,
    stays_below_from,
    summarize,
)
from dlc_jax.experiments.report import write_report
from dlc_jax.experiments.results import NoiseThreshold, RunResult, load_results

STEPS = list(range(1, 11))


def _run(
    name, arm, scenario, kl, ess, lag, ell_var, reward=None, resyncs=None, k3=None, kl_steps=None
):
    series = {
        "ess_lag": ess,
        "ess_gaussian": [math.exp(-v) for v in ell_var],
        "ell_std": [math.sqrt(v) for v in ell_var],
        "version_lag": lag,
        "reward": reward or [0.1 * s for s in STEPS],
        "resyncs": resyncs or [0] * len(STEPS),
        "delta_std": [0.01] * len(STEPS),
        "mismatch_k3": k3 or [0.001] * len(STEPS),
    }
    return RunResult(
        name=name,
        arm=arm,
        scenario=scenario,
        steps=STEPS,
        series=series,
        kl_steps=kl_steps or [0, 5, 10][-len(kl) :],
        kl_forward=kl,
        kl_reverse=kl,
        wall_s=1.5,
    )


NOISE = NoiseThreshold(steps=[0, 5, 10], forward=[0.0, 0.01, 0.02], reverse=[0.0, 0.011, 0.019])


def _experiment(tmp_path):
    never = list(STEPS)  # never synced: lag k = step
    dlc = _run(
        "stale__dlc",
        "dlc",
        "stale",
        [0.0, 0.015, 0.03],
        [0.9] * 10,
        [1, 2, 3, 1, 2, 3, 1, 2, 3, 1],
        [0.05 * k * k for k in [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]],
        resyncs=[0, 0, 0, 1, 1, 1, 2, 2, 2, 3],
    )
    tis = _run(
        "stale__tis",
        "tis",
        "stale",
        [0.0, 0.05, 0.01],
        [0.9, 0.8, 0.6, 0.45, 0.6, 0.4, 0.3, 0.3, 0.2, 0.1],
        never,
        [0.1 * k for k in never],
        reward=[0.0] * 9 + [0.7],
    )
    on1 = _run(
        "onpolicy_seed1", "onpolicy", "reference", [0.0, 0.0, 0.0], [1.0] * 10, [0] * 10, [0.0] * 10
    )
    on2 = _run(
        "onpolicy_seed2",
        "onpolicy",
        "reference",
        [0.0, 0.01, 0.02],
        [1.0] * 10,
        [0] * 10,
        [0.0] * 10,
    )
    for r in (dlc, tis, on1, on2):
        r.save(tmp_path)
    NOISE.save(tmp_path)
    return dlc, tis


def test_distance_ratio_skips_zero_noise_and_divides():
    r = RunResult(
        "x",
        "tis",
        "s",
        [1],
        {},
        kl_steps=[0, 5, 10, 15],
        kl_forward=[0.0, 0.05, 0.01, 9.0],
        kl_reverse=[0.0] * 4,
    )
    steps, ratios = distance_ratio(r, NOISE)
    assert steps == [5, 10]  # step 0 has N=0, step 15 has no noise measurement
    np.testing.assert_allclose(ratios, [5.0, 0.5])


def test_ess_crossings():
    ess = [0.9, 0.8, 0.6, 0.45, 0.6, 0.4, 0.3, 0.3, 0.2, 0.1]
    assert first_below(STEPS, ess, 0.5) == 4
    assert stays_below_from(STEPS, ess, 0.5) == 6
    assert stays_below_from(STEPS, ess[:-1] + [0.7], 0.5) is None
    assert stays_below_from(STEPS, ess, 0.5, min_steps=5) == 6
    assert stays_below_from(STEPS, ess, 0.5, min_steps=6) is None  # only 5 steps below at the end
    assert first_below(STEPS, [None] * 10, 0.5) is None


@pytest.mark.parametrize("a,b", [(0.1, 0.0), (0.0, 0.05), (0.02, 0.03)])
def test_lag_variance_fit_and_crossing(a, b):
    k = np.arange(1, 5, dtype=float)
    fa, fb = fit_lag_variance(k, a * k + b * k * k)
    np.testing.assert_allclose([fa, fb], [a, b], atol=1e-9)
    ks = solve_crossing(fa, fb)
    assert a * ks + b * ks * ks == pytest.approx(math.log(2), rel=1e-9)


def test_predicted_crossing_uses_first_sync_window():
    # sync at step 2 (lag 0 there), then lag grows 1, 2, 3 with Var = 0.05 k^2, then a resync
    steps = [1, 2, 3, 4, 5, 6, 7]
    lag = [1, 0, 1, 2, 3, 0, 1]
    var = [0.05 * k * k if k else 0.0 for k in lag]
    var[5:] = [9.0, 9.0]  # after the resync: must not enter the fit
    r = RunResult(
        "x", "dlc", "s", steps, {"version_lag": lag, "ell_std": [math.sqrt(v) for v in var]}
    )
    # first window: steps 1..5 (lag 1, 0, 1, 2, 3 -- the drop at step 2 is a resync => window =
    # [step 1])
    # so only the lag-1 point at step 1 (sync at step 0) is used: Var = 0.05 * 1
    pred = predicted_crossing(r, AnalysisConfig(fit_points=4))
    # one point: both single-term fits are exact; the linear one (0.05 k) wins the tie -> k* =
    # ln2/0.05
    assert pred == pytest.approx(math.log(2) / 0.05)
    lag2 = [0, 1, 2, 3, 4, 0, 1]
    r2 = RunResult(
        "y",
        "dlc",
        "s",
        steps,
        {"version_lag": lag2, "ell_std": [math.sqrt(0.05) * k for k in lag2[:5]] + [3.0, 3.0]},
    )
    assert predicted_crossing(r2) == pytest.approx(1 + math.sqrt(math.log(2) / 0.05))


def test_summary_numbers(tmp_path):
    dlc, tis = _experiment(tmp_path)
    s = summarize(tis, NOISE)
    assert s.max_ratio == pytest.approx(5.0) and s.max_ratio_step == 5
    assert s.ess_first_below == 4 and s.ess_stays_below_from == 6
    assert s.max_ratio_after_ess_stays_below == pytest.approx(0.5)
    assert s.ess_predicted == pytest.approx(math.log(2) / 0.1)
    assert s.gaussian_first_below == 7  # exp(-0.1 k) < 0.5 <=> k > 6.93
    assert s.final_reward == pytest.approx(0.7)  # last 10% of 10 steps = the last step
    d = summarize(dlc, NOISE)
    assert d.max_ratio == pytest.approx(1.5) and d.resyncs == 3 and d.ess_first_below is None
    assert d.ess_predicted == pytest.approx(math.sqrt(math.log(2) / 0.05))


def _seeded_experiment(
    tmp_path, *, tis_far=True, dlc_resyncs=(0, 0, 0, 1, 1, 1, 2, 2, 2, 3), noresync_near=False
):
    """3 on-policy runs (pairs KL 0.01 / 0.02 at steps 5 / 10), DLC close to them, TIS far (or
    not); DLC without resync = TIS's numbers, or (``noresync_near``) as close as DLC on the
    reference prefixes and far on its own."""
    steps = [5, 10]
    names = [f"onpolicy__s{i}" for i in range(3)]
    pairs = {f"{a}|{b}": [0.01, 0.02] for a in names for b in names if a != b}
    own_pairs = {k: [0.02, 0.04] for k in pairs}
    NoiseThreshold(
        steps=steps, forward=[0.01, 0.02], reverse=[0.01, 0.02], pairs=pairs, own_pairs=own_pairs
    ).save(tmp_path)
    never = list(STEPS)
    ess_tis = [0.9, 0.8, 0.6, 0.45, 0.3, 0.3, 0.2, 0.2, 0.1, 0.1]
    for i, n in enumerate(names):
        refs = [m for m in names if m != n]
        r = _run(n, "onpolicy", "reference", [0.01, 0.02], [1.0] * 10, [0] * 10, [0.0] * 10)
        r.kl_steps, r.seed = steps, i
        r.kl_by_ref = {m: [0.01, 0.02] for m in refs}
        r.own_kl_by_ref = {m: [0.02, 0.04] for m in refs}
        r.save(tmp_path)
        far = 4.0 + i if tis_far else 1.0
        t = _run(
            f"collapse__tis__s{i}",
            "tis",
            "collapse",
            [0.01, 0.02 * far],
            ess_tis,
            never,
            [0.1 * k for k in never],
            reward=[0.2] * 10,
        )
        t.kl_steps, t.seed = steps, i
        t.kl_by_ref = {m: [0.01, 0.02 * far] for m in refs}
        t.own_kl_by_ref = {m: [0.02, 0.04] for m in refs}  # looks on-policy on its own prefixes
        t.save(tmp_path)
        d = _run(
            f"collapse__dlc__s{i}",
            "dlc",
            "collapse",
            [0.01, 0.02],
            [0.9] * 10,
            [1, 2, 3, 1, 2, 3, 1, 2, 3, 1],
            [0.05] * 10,
            resyncs=list(dlc_resyncs),
        )
        d.kl_steps, d.seed = steps, i
        d.kl_by_ref = {m: [0.01, 0.015 + 0.005 * i] for m in refs}
        d.own_kl_by_ref = {m: [0.02, 0.04] for m in refs}
        d.save(tmp_path)
        nr = RunResult.from_json(
            {**t.to_json(), "name": f"collapse__dlc_noresync__s{i}", "arm": "dlc_noresync"}
        )
        if noresync_near:
            nr.kl_by_ref = {m: [0.01, 0.015 + 0.005 * (2 - i)] for m in refs}
            nr.own_kl_by_ref = {m: [0.02, 0.04 * (4.0 + i)] for m in refs}
        nr.save(tmp_path)


def test_report_is_generated_from_the_inputs(tmp_path):
    _seeded_experiment(tmp_path)
    path = write_report(tmp_path)
    md = path.read_text()
    # DLC: D/N is 1 at step 5 and mean(0.015, 0.02, 0.025)/0.02 = 1 at step 10 (resamples in [0.75,
    # 1.25])
    assert "| dlc | 3 | 1.00 [1.00, 1.25] | within |" in md
    # TIS: factors 4, 5, 6 -> mean 5 at step 10; resamples in [4, 6]
    assert "| tis | 3 | 5.00 [4.00, 6.00] | outside |" in md
    assert "1. *DLC stays within 2x noise under the stale sampler*: **held**" in md
    assert "2. *Importance weighting leaves the band once its ESS stays below 0.5*: **held**" in md
    assert "3. *DLC's resync prevents collapses that per-token corrections leave*: **held**" in md
    # TIS is outside on the sampler's prefixes and within on its own: the sampler-prefix KL
    # missed nothing here
    assert (
        "4. *A KL on the sampler's own prefixes does not detect the collapses*: **inconclusive**"
        in md
    )
    assert "tis: sampler's 5.00 [4.00, 6.00] (outside) vs own 1.00 [1.00, 1.00] (within)" in md
    assert "3 on-policy runs (onpolicy__s0, onpolicy__s1, onpolicy__s2)" in md
    for png in ("collapse.png", "ess_crossing.png", "noise.png"):
        b = (tmp_path / "plots" / png).read_bytes()
        assert b[:8] == b"\x89PNG\r\n\x1a\n" and len(b) < 600_000


def test_verdicts_follow_the_intervals(tmp_path):
    _seeded_experiment(tmp_path, tis_far=False)
    md = write_report(tmp_path).read_text()
    assert "| tis | 3 | 1.00 [1.00, 1.00] | within |" in md
    assert (
        "2. *Importance weighting leaves the band once its ESS stays below 0.5*: **not held**" in md
    )
    assert "No per-token arm left the band, so there was no collapse to prevent." in md
    assert (
        "3. *DLC's resync prevents collapses that per-token corrections leave*: **inconclusive**"
        in md
    )


def test_resync_claim_is_untested_when_dlc_never_resynced(tmp_path):
    # DLC within the band and TIS far outside, but DLC's trigger never fired: DLC ran as DLC
    # without resync, so the claim about the resync cannot be held on this evidence
    _seeded_experiment(tmp_path, dlc_resyncs=(0,) * 10)
    md = write_report(tmp_path).read_text()
    assert "1. *DLC stays within 2x noise under the stale sampler*: **held**" in md
    assert (
        "3. *DLC's resync prevents collapses that per-token corrections leave*: **inconclusive**"
        in md
    )
    assert "DLC's ESS trigger never fired (0 resyncs in every seed)" in md


def test_claims_3_and_4_need_the_resync_to_help_and_own_prefixes_to_catch_a_miss(tmp_path):
    # DLC without resync is as close to on-policy as DLC on the reference (= the never-synced
    # sampler's) prefixes, but far on its own prefixes: the sampler-prefix KL missed a collapse
    # (claim 4 held), and DLC's resync did not beat DLC without resync on the paired
    # difference (claim 3 not held, although DLC fired, stayed within and TIS collapsed)
    _seeded_experiment(tmp_path, noresync_near=True)
    md = write_report(tmp_path).read_text()
    assert (
        "3. *DLC's resync prevents collapses that per-token corrections leave*: **inconclusive**"
        in md
    )
    assert "DLC minus DLC-without-resync, paired over seeds (held needs it below 0): 0.00 [" in md
    assert "4. *A KL on the sampler's own prefixes does not detect the collapses*: **held**" in md
    assert "that the sampler-prefix ratio places within it: dlc_noresync;" in md


def test_report_says_when_noise_is_missing(tmp_path):
    _seeded_experiment(tmp_path)
    (tmp_path / "noise.json").unlink()
    md = write_report(tmp_path).read_text()
    assert "No noise threshold" in md


def test_bad_result_file_is_named(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):
        load_results(tmp_path)
    with pytest.raises(ValueError, match="series 'reward'"):
        RunResult("x", "a", "s", [1, 2], {"reward": [1.0]})


def test_stays_below_uses_the_trailing_median():
    from dlc_jax.experiments.analysis import trailing_median

    ess = [0.9, 0.4, 0.3, 0.7, 0.2, 0.1, 0.6, 0.2, 0.1]
    assert trailing_median(ess, 3) == [0.9, 0.65, 0.4, 0.4, 0.3, 0.2, 0.2, 0.2, 0.2]
    assert trailing_median([0.5, None, 0.1], 2) == [0.5, None, 0.3]
    steps = list(range(1, 10))
    assert stays_below_from(steps, ess, 0.5) == 8  # raw: the 0.6 at step 7 resets the onset
    assert stays_below_from(steps, trailing_median(ess, 3), 0.5) == 3


def test_report_says_when_noise_is_zero(tmp_path):
    _seeded_experiment(tmp_path)
    n = NoiseThreshold.load(tmp_path)
    n.forward = [0.0, 0.0]
    n.pairs = {k: [0.0, 0.0] for k in n.pairs}
    n.save(tmp_path)
    md = write_report(tmp_path).read_text()
    assert "N_t is 0 at every checkpoint" in md and "**held**" not in md
