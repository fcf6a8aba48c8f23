"""Decomposition, ESS, advantages, resync rule and step metrics against hand values and numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlc_jax.rl import (
    decompose,
    ess,
    gaussian_ess,
    group_advantages,
    resync_decision,
    sequence_ess,
    step_metrics,
)
from dlc_jax.rl.masked import quantiles


def test_decomposition_identity_and_stats():
    rng = np.random.default_rng(0)
    lp, lp_s, lp_q = (jnp.asarray(rng.normal(size=(3, 9)) - 2, jnp.float32) for _ in range(3))
    mask = jnp.asarray(rng.random((3, 9)) > 0.3, jnp.float32)
    # padding holds garbage that must not leak
    lp = jnp.where(mask > 0, lp, jnp.nan)
    d = decompose(lp, lp_s, lp_q, mask)
    np.testing.assert_allclose(d["delta"] + d["ell"], d["total"], atol=1e-6)
    m = np.asarray(mask) > 0
    tot = (np.asarray(lp) - np.asarray(lp_q))[m]
    ell = (np.asarray(lp) - np.asarray(lp_s))[m]
    np.testing.assert_allclose(d["total_mean"], tot.mean(), rtol=1e-5)
    np.testing.assert_allclose(d["ell_std"], ell.std(), rtol=1e-5)
    for q, key in [(0.05, "ell_q05"), (0.5, "ell_q50"), (0.95, "ell_q95")]:
        np.testing.assert_allclose(d[key], np.quantile(ell, q), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d["ell_abs_p99"], np.quantile(np.abs(ell), 0.99), rtol=1e-5)
    np.testing.assert_allclose(d["total_abs_p99"], np.quantile(np.abs(tot), 0.99), rtol=1e-5)
    np.testing.assert_allclose(d["kl_k1"], np.mean(-tot), rtol=1e-5)
    np.testing.assert_allclose(d["kl_k3"], np.mean(np.exp(tot) - 1 - tot), rtol=1e-5)
    assert all(np.isfinite(float(v)) for k, v in d.items() if np.ndim(v) == 0)


def test_kl_hand_values():
    # one valid token: lp - lp_q = ln 2 -> k1 = -ln2, k3 = 2 - 1 - ln 2
    lp = jnp.array([[np.log(0.5), 0.0]])
    lq = jnp.array([[np.log(0.25), 5.0]])
    d = decompose(lp, lp, lq, jnp.array([[1.0, 0.0]]))
    np.testing.assert_allclose(d["kl_k1"], -np.log(2), rtol=1e-6)
    np.testing.assert_allclose(d["kl_k3"], 1 - np.log(2), rtol=1e-6)


def test_quantiles_empty_and_single():
    x = jnp.array([[3.0, 1.0]])
    np.testing.assert_array_equal(quantiles(x, jnp.zeros((1, 2)), (0.5,)), [0.0])
    np.testing.assert_array_equal(quantiles(x, jnp.array([[0.0, 1.0]]), (0.1, 0.9)), [1.0, 1.0])


def test_ess_hand_values():
    # weights 1, 2, 3, 4 (log-ratios) and a masked 100 -> (10)^2 / (4 * 30) = 0.8333
    lr = jnp.log(jnp.array([[1.0, 2.0, 3.0], [4.0, 100.0, 1.0]]))
    mask = jnp.array([[1, 1, 1], [1, 0, 0]], jnp.float32)
    np.testing.assert_allclose(ess(lr, mask), 100 / 120, rtol=1e-6)
    # overflow-safe: shift by +500 in log space, same ESS
    np.testing.assert_allclose(ess(lr + 500.0, mask), 100 / 120, rtol=1e-6)
    # equal weights -> 1; a single dominant weight among n -> ~1/n
    np.testing.assert_allclose(ess(jnp.zeros((2, 3)), jnp.ones((2, 3))), 1.0, rtol=1e-6)
    np.testing.assert_allclose(ess(jnp.array([[60.0, 0, 0, 0]]), jnp.ones((1, 4))), 0.25, rtol=1e-6)
    # no valid token -> defined as 1.0
    assert float(ess(lr, jnp.zeros_like(mask))) == 1.0
    # sequence ESS: sums per row are log 6 and log 4 -> (10)^2/(2*52)
    np.testing.assert_allclose(sequence_ess(lr, mask), 100 / 104, rtol=1e-6)
    # gaussian: var of log([1,2,3,4])
    np.testing.assert_allclose(
        gaussian_ess(lr, mask), np.exp(-np.var(np.log([1, 2, 3, 4]))), rtol=1e-6
    )


@pytest.mark.parametrize("sigma2", [np.log(2.0), 0.2, 1.0])
def test_ess_lognormal_matches_gaussian_prediction(sigma2):
    rng = np.random.default_rng(1)
    x = rng.normal(-0.3, np.sqrt(sigma2), size=(64, 4096))
    mask = jnp.ones(x.shape)
    e = float(ess(jnp.asarray(x, jnp.float32), mask))
    np.testing.assert_allclose(e, np.exp(-sigma2), rtol=0.03)
    np.testing.assert_allclose(
        float(gaussian_ess(jnp.asarray(x, jnp.float32), mask)), np.exp(-sigma2), rtol=0.01
    )
    if np.isclose(sigma2, np.log(2)):
        assert abs(e - 0.5) < 0.015


def test_group_advantages():
    r = jnp.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    # group 0: mean .5, unbiased std sqrt(1/3)
    np.testing.assert_allclose(
        group_advantages(r, "grpo")[0],
        np.array([0.5, -0.5, -0.5, 0.5]) / (np.sqrt(1 / 3) + 1e-6),
        rtol=1e-6,
    )
    np.testing.assert_allclose(group_advantages(r, "grpo")[1], 0.0)  # constant group -> 0, no NaN
    np.testing.assert_allclose(group_advantages(r, "mean")[0], [0.5, -0.5, -0.5, 0.5])
    np.testing.assert_allclose(group_advantages(r, "drgrpo"), group_advantages(r, "mean"))
    with pytest.raises(ValueError, match="advantage mode"):
        group_advantages(r, "ppo")
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        group_advantages(r[0], "grpo")


def test_resync_decision():
    mask = jnp.ones((1, 4))
    lp_s = jnp.zeros((1, 4))
    same = resync_decision(lp_s, lp_s, mask)
    assert not bool(same.resync) and float(same.ess) == pytest.approx(1.0)
    # ratios [1, 1, 1, e^3]: ESS = (3+e^3)^2 / (4 (3 + e^6)) ~ 0.306 < 0.5
    lp = jnp.array([[0.0, 0.0, 0.0, 3.0]])
    d = jax.jit(resync_decision)(lp, lp_s, mask)
    e3 = np.exp(3.0)
    np.testing.assert_allclose(d.ess, (3 + e3) ** 2 / (4 * (3 + e3**2)), rtol=1e-6)
    assert bool(d.resync)
    np.testing.assert_allclose(d.ess_gaussian, np.exp(-np.var([0, 0, 0, 3.0])), rtol=1e-6)
    assert not bool(resync_decision(lp, lp_s, mask, threshold=0.2).resync)
    resync, e, eg = resync_decision(lp, lp_s, jnp.zeros((1, 4)))  # tuple-unpackable; empty -> no
    assert not bool(resync) and float(e) == 1.0


def test_step_metrics_values():
    lp = jnp.array([[-1.0, -2.0, -3.0]])
    lp_s = jnp.array([[-1.5, -2.0, -2.0]])
    lp_q = jnp.array([[-1.0, -1.0, -1.0]])
    mask = jnp.array([[1.0, 1.0, 0.0]])
    lq_head = jnp.log(jnp.array([[[0.5, 0.2], [0.1, 0.1], [0.9, 0.9]]]))
    out = jax.jit(step_metrics)(
        lp, lp_s, lp_q, mask, lq_head=lq_head, entropy=jnp.array([[1.0, 3.0, 100.0]])
    )
    np.testing.assert_allclose(out["ell_mean"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(out["delta_mean"], -0.75, rtol=1e-6)
    np.testing.assert_allclose(out["head_mass_q"], 0.45, rtol=1e-6)
    np.testing.assert_allclose(out["entropy_mean"], 2.0, rtol=1e-6)
    w = np.exp([0.5, 0.0])
    np.testing.assert_allclose(out["ess_lag"], w.sum() ** 2 / (2 * (w**2).sum()), rtol=1e-6)
    np.testing.assert_allclose(out["ess_lag_gaussian"], np.exp(-np.var([0.5, 0.0])), rtol=1e-6)
