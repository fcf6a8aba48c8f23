"""Every correction loss: hand values, an independent numpy reference (value and analytic
gradient), finite differences, the special cases of DESIGN.md 3, and bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

from dlc_jax.rl import LOSSES, LossConfig, LossInputs, compute_loss, validate_inputs

B, T, V, K = 3, 5, 12, 4


def make_batch(seed=0, lag=0.15, disc=0.3, full_head=False):
    """Realistic batch: per position real distributions p (trainer at theta), p_s (trainer at
    theta_s) and q (sampler); the token is sampled from q; the head is q's top-K ids."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(B, T, V)) * 1.5
    zs = z + rng.normal(size=z.shape) * lag
    zq = zs + rng.normal(size=z.shape) * disc
    zo = z + rng.normal(size=z.shape) * lag
    lsm = lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))
    lpv, lsv, lqv, lov = lsm(z), lsm(zs), lsm(zq), lsm(zo)
    tok = np.array([[rng.choice(V, p=np.exp(lqv[b, t])) for t in range(T)] for b in range(B)])
    k = V if full_head else K
    head = np.argsort(-lqv, axis=-1)[..., :k]
    g = lambda a, i: np.take_along_axis(a, i, -1)
    mask = np.ones((B, T))
    mask[0, 3:] = 0
    mask[2, 4] = 0
    return dict(
        lp=g(lpv, tok[..., None])[..., 0],
        lp_q=g(lqv, tok[..., None])[..., 0],
        lp_s=g(lsv, tok[..., None])[..., 0],
        lp_old=g(lov, tok[..., None])[..., 0],
        lp_head=g(lpv, head),
        lq_head=g(lqv, head),
        lps_head=g(lsv, head),
        mask=mask,
        adv=rng.normal(size=B),
    )


def to_inputs(d, **over):
    d = {**d, **over}
    return LossInputs(
        **{k: None if v is None else jnp.asarray(v, jnp.float32) for k, v in d.items()}
    )


CFGS = {
    "naive": LossConfig(name="naive"),
    "tis": LossConfig(name="tis", tis_cap=1.3),
    "tis_seq": LossConfig(name="tis_seq", seq_tis_cap=1.5),
    "mis": LossConfig(name="mis", mis_low=0.8, mis_high=1.25),
    "mis_seq": LossConfig(name="mis_seq", mis_low=0.5, mis_high=1.5),
    "mis_geo": LossConfig(name="mis_geo", geo_low=0.85, geo_high=1.2),
    "score_centering": LossConfig(name="score_centering"),
    "score_centering_tis": LossConfig(name="score_centering_tis", tis_cap=1.2),
    "score_centering_mask": LossConfig(name="score_centering_mask", mis_low=0.8, mis_high=1.25),
    "ppo_clip": LossConfig(name="ppo_clip", clip_low=0.1, clip_high=0.15, dual_clip=1.2),
    "decoupled_ppo": LossConfig(name="decoupled_ppo", clip_low=0.1, clip_high=0.15, behave_cap=1.3),
    "m2po": LossConfig(name="m2po", m2_threshold=0.02),
    "vcpo": LossConfig(name="vcpo", seq_tis_cap=1.5),
    "dlc": LossConfig(name="dlc", clip_low=0.1, clip_high=0.1),
}


# ------------------------------------------------------------------ independent numpy reference


def np_reference(cfg, d, lp_var=None, lph_var=None):
    """(loss, dL/dlp [B,T], dL/dlp_head [B,T,K]) from the formulas, in f64.

    The surrogate loss value is a function of the differentiable occurrences ``lp_var`` and
    ``lph_var`` (default: d's values); every stop-gradient quantity (IS weights, masks, centering
    residuals) is computed from the frozen ``d``. Finite differences of the value w.r.t.
    lp_var/lph_var therefore give the gradient that autodiff of the surrogate should produce.
    The returned gradients are the analytic forms (valid at lp_var = lp)."""
    lp, lq, ls, lo = d["lp"], d["lp_q"], d["lp_s"], d["lp_old"]
    x = lp if lp_var is None else lp_var
    xh = d["lp_head"] if lph_var is None else lph_var
    m, A = d["mask"], np.broadcast_to(d["adv"][:, None], d["lp"].shape)
    lpH, lqH, lsH = d["lp_head"], d["lq_head"], d["lps_head"]
    n = m.sum()
    g_h = np.zeros_like(lpH)
    name = cfg.name
    lo_c, hi_c = 1 - cfg.clip_low, 1 + cfg.clip_high

    def seq(x):
        return np.array([sum(x[b, t] for t in range(x.shape[1]) if m[b, t]) for b in range(B)])

    def ppo(r, a):
        per = -np.minimum(r * a, np.clip(r, lo_c, hi_c) * a)
        act = np.where(a >= 0, r <= hi_c, r >= lo_c).astype(float)
        if cfg.dual_clip is not None:
            dual = (a < 0) & (per > -cfg.dual_clip * a)
            per = np.where(dual, -cfg.dual_clip * a, per)
            act = act * ~dual
        return per, act

    if name == "naive":
        per, coef = -A * x, A
    elif name == "tis":
        w = np.minimum(np.exp(lp - lq), cfg.tis_cap)
        per, coef = -w * A * x, w * A
    elif name in ("tis_seq", "vcpo"):
        w = np.minimum(np.exp(seq(lp - lq)), cfg.seq_tis_cap)[:, None]
        per, coef = -w * A * x, w * A
    elif name == "mis":
        k = np.exp(lp - lq)
        w = k * ((k >= cfg.mis_low) & (k <= cfg.mis_high))
        per, coef = -w * A * x, w * A
    elif name == "mis_seq":
        k = np.exp(seq(lp - lq))
        w = (k * ((k >= cfg.mis_low) & (k <= cfg.mis_high)))[:, None]
        per, coef = -w * A * x, w * A
    elif name == "mis_geo":
        g = np.exp(seq(lp - lq) / m.sum(-1))
        w = ((g >= cfg.geo_low) & (g <= cfg.geo_high))[:, None].astype(float)
        per, coef = -w * A * x, w * A
    elif name.startswith("score_centering"):
        mode = {
            "score_centering": cfg.centering_weight,
            "score_centering_tis": "tis",
            "score_centering_mask": "mask",
        }[name]
        f = {
            "none": lambda r: np.ones_like(r),
            "tis": lambda r: np.minimum(r, cfg.tis_cap),
            "mask": lambda r: r * ((r >= cfg.mis_low) & (r <= cfg.mis_high)),
        }[mode]
        pH, qH = np.exp(lpH), np.exp(lqH)
        rho = np.maximum(1 - qH.sum(-1), 1e-6) / np.maximum(1 - pH.sum(-1), 1e-6)
        alpha = rho * f(1 / rho)
        wt = f(np.exp(lp - lq))
        resid = qH * f(np.exp(lpH - lqH)) - alpha[..., None] * pH
        per = -A * (wt * x - (resid * xh).sum(-1))
        coef = A * wt
        g_h = A[..., None] * resid
    elif name == "ppo_clip":
        r = np.exp(x - lo)
        per, act = ppo(r, A)
        coef = A * r * act
    elif name == "decoupled_ppo":
        w = np.minimum(np.exp(lo - lq), cfg.behave_cap)
        r = np.exp(x - lo)
        per, act = ppo(r, A)
        per = w * per
        coef = w * A * r * act
    elif name == "m2po":
        d2 = (lq - lo) ** 2
        vals = sorted(
            ((d2[b, t], b * T + t) for b in range(B) for t in range(T) if m[b, t]),
            key=lambda x: -x[0],
        )
        nv = len(vals)
        n_drop = nv - 1
        for j in range(nv):
            if np.mean([v for v, _ in vals[j:]]) < cfg.m2_threshold:
                n_drop = j
                break
        keep = np.ones((B, T))
        for _, idx in vals[:n_drop]:
            keep[idx // T, idx % T] = 0
        r = np.exp(x - lo)
        per = -keep * r * A
        coef = keep * r * A
    elif name == "dlc":
        r = np.exp(x - ls)
        per, act = ppo(r, A)
        coef = A * r * act
        pH, qH, sH = np.exp(lpH), np.exp(lqH), np.exp(lsH)
        pt = np.maximum(1 - pH.sum(-1), 1e-6)
        qt = np.maximum(1 - qH.sum(-1), 1e-6)
        st = np.maximum(1 - sH.sum(-1), 1e-6)
        rH = pH / sH
        actH = np.where(A[..., None] >= 0, rH <= hi_c, rH >= lo_c)
        rt = pt / st
        actT = np.where(A >= 0, rt <= hi_c, rt >= lo_c)
        # only the discrepancy q vs p_s is centered: E_q[r act s] - E_{p_s}[r act s]
        resid = (qH - sH) * rH * actH - (((qt - st) / pt) * rt * actT)[..., None] * pH
        per = per + A * (resid * xh).sum(-1)
        g_h = A[..., None] * resid
    else:
        raise KeyError(name)
    loss = (per * m).sum() / n
    return loss, -coef * m / n, g_h * m[..., None] / n


def _loss_of(cfg, lp, lp_head, inp):
    return compute_loss(cfg, dataclasses.replace(inp, lp=lp, lp_head=lp_head))


# one jitted program per (config, input structure and shapes), shared by every test that asks for
# it (the batches mostly differ in values only), instead of a fresh program per call
_LOSS_AND_GRADS = jax.jit(
    jax.value_and_grad(_loss_of, argnums=(1, 2), has_aux=True), static_argnums=0
)


def jax_loss_and_grads(cfg, d, **over):
    inp = to_inputs(d, **over)
    (loss, metrics), (g, gh) = _LOSS_AND_GRADS(cfg, inp.lp, inp.lp_head, inp)
    return loss, metrics, g, gh


def test_registry_is_complete():
    assert (
        set(LOSSES)
        == set(CFGS)
        == {
            "naive",
            "tis",
            "tis_seq",
            "mis",
            "mis_seq",
            "mis_geo",
            "score_centering",
            "score_centering_tis",
            "score_centering_mask",
            "ppo_clip",
            "decoupled_ppo",
            "m2po",
            "vcpo",
            "dlc",
        }
    )
    # LossConfig is hashable, so it can be a static jit argument
    inp = to_inputs(make_batch())
    l_static, _ = jax.jit(compute_loss, static_argnums=0)(CFGS["dlc"], inp)
    np.testing.assert_allclose(l_static, compute_loss(CFGS["dlc"], inp)[0], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(CFGS))
def test_loss_value_and_gradient_match_reference(name):
    cfg = CFGS[name]
    d = make_batch()
    loss, metrics, g, gh = jax_loss_and_grads(cfg, d)
    ref, ref_g, ref_gh = np_reference(cfg, d)
    np.testing.assert_allclose(loss, ref, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(g, ref_g, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(gh, ref_gh, rtol=2e-5, atol=1e-6)
    assert np.abs(ref_g).sum() > 0  # the test exercises a nonzero gradient
    for k, v in metrics.items():
        assert np.ndim(v) == 0 and np.isfinite(float(v)), k
    for k in ("clip_frac", "masked_frac", "weight_ess"):
        assert k in metrics


@pytest.mark.parametrize("name", sorted(CFGS))
def test_gradient_matches_finite_differences(name):
    """jax.grad of the surrogate == central differences (f64) of the numpy surrogate, with the
    stop-gradient quantities frozen."""
    cfg = CFGS[name]
    d = make_batch(seed=3)
    _, _, g, gh = jax_loss_and_grads(cfg, d)
    eps = 1e-6
    for var, got in (("lp", g), ("lp_head", gh)):
        fd = np.zeros(d[var].shape)
        for idx in np.ndindex(d[var].shape):
            plus, minus = d[var].copy(), d[var].copy()
            plus[idx] += eps
            minus[idx] -= eps
            kw_p = {"lp_var" if var == "lp" else "lph_var": plus}
            kw_m = {"lp_var" if var == "lp" else "lph_var": minus}
            fd[idx] = (np_reference(cfg, d, **kw_p)[0] - np_reference(cfg, d, **kw_m)[0]) / (
                2 * eps
            )
        np.testing.assert_allclose(got, fd, rtol=1e-4, atol=1e-7, err_msg=var)


# losses whose value is a genuine function of lp (no stop-gradient weight computed from lp itself):
# their surrogate gradient is the true derivative, so JAX's own finite-difference check applies.
TRUE_GRADIENT_LOSSES = ("naive", "ppo_clip", "decoupled_ppo", "m2po", "mis_geo")


@pytest.mark.parametrize("name", TRUE_GRADIENT_LOSSES)
def test_check_grads_where_surrogate_is_the_value(name):
    cfg = CFGS[name]
    inp = to_inputs(make_batch(seed=3))

    def f(lp):
        return compute_loss(cfg, dataclasses.replace(inp, lp=lp))[0]

    jax.test_util.check_grads(f, (inp.lp,), order=1, modes=("rev",), eps=1e-3)


def test_metrics_are_exercised():
    """Clip/mask fractions are neither trivially 0 nor 1 on the test batch, and match numpy."""
    d = make_batch()
    m = d["mask"] > 0
    _, met, _, _ = jax_loss_and_grads(CFGS["tis"], d)
    np.testing.assert_allclose(met["clip_frac"], np.mean(np.exp(d["lp"] - d["lp_q"])[m] > 1.3))
    assert 0 < float(met["clip_frac"]) < 1
    _, met, _, _ = jax_loss_and_grads(CFGS["mis"], d)
    k = np.exp(d["lp"] - d["lp_q"])[m]
    np.testing.assert_allclose(met["masked_frac"], np.mean((k < 0.8) | (k > 1.25)), rtol=1e-6)
    _, met, _, _ = jax_loss_and_grads(CFGS["dlc"], d)
    r = np.exp(d["lp"] - d["lp_s"])[m]
    a = np.broadcast_to(d["adv"][:, None], m.shape)[m]
    clip = np.where(a >= 0, r > 1.1, r < 0.9)
    np.testing.assert_allclose(met["clip_frac"], clip.mean(), rtol=1e-6)
    np.testing.assert_allclose(met["weight_ess"], r.sum() ** 2 / (len(r) * (r**2).sum()), rtol=1e-5)
    assert 0 < float(met["clip_frac"]) < 1 and float(met["dlc_centering_active"]) == 1.0
    _, met, _, _ = jax_loss_and_grads(CFGS["m2po"], d)
    assert 0 < float(met["masked_frac"]) < 1 and float(met["m2_after"]) < 0.02
    _, met, _, _ = jax_loss_and_grads(CFGS["vcpo"], d)
    s = np.array([(d["lp"] - d["lp_q"])[b][m[b]].sum() for b in range(B)])
    w = np.exp(s)
    ess = w.sum() ** 2 / (B * (w**2).sum())
    np.testing.assert_allclose(met["ess_seq"], ess, rtol=1e-5)
    np.testing.assert_allclose(met["lr_scale"], np.sqrt(min(1.0, ess)), rtol=1e-5)
    _, met, _, _ = jax_loss_and_grads(
        dataclasses.replace(CFGS["vcpo"], vcpo_rule="linear", vcpo_base_ess=0.5), d
    )
    np.testing.assert_allclose(met["lr_scale"], min(1.0, ess / 0.5), rtol=1e-5)


# ------------------------------------------------------------------------- hand examples


def one(lp, lq, adv, **kw):
    d = dict(lp=[[lp]], lp_q=[[lq]], mask=[[1.0]], adv=[adv])
    d.update({k: [[v]] if np.ndim(v) == 0 else [[v]] for k, v in kw.items()})
    return to_inputs(d)


def test_hand_values():
    ln = np.log
    # naive: -A lp = -2 * ln .5
    assert float(
        compute_loss(LossConfig(name="naive"), one(ln(0.5), ln(0.5), 2.0))[0]
    ) == pytest.approx(2 * ln(2), rel=1e-6)
    # tis: r = .5/.2 = 2.5 capped at 2 -> -2 * 1 * ln .5
    assert float(
        compute_loss(LossConfig(name="tis"), one(ln(0.5), ln(0.2), 1.0))[0]
    ) == pytest.approx(2 * ln(2), rel=1e-6)
    # mis: r = 2.5 in [0.5, 5] -> -2.5 ln .5 ; r = 10 -> masked -> 0
    assert float(
        compute_loss(LossConfig(name="mis"), one(ln(0.5), ln(0.2), 1.0))[0]
    ) == pytest.approx(2.5 * ln(2), rel=1e-6)
    assert float(compute_loss(LossConfig(name="mis"), one(ln(0.5), ln(0.05), 1.0))[0]) == 0.0
    # ppo: r = .6/.4 = 1.5, A = 1, clip_high .28 -> -1.28 ; A = -1 -> -min(-1.5, -1.28) = 1.5
    ppo = LossConfig(name="ppo_clip")
    assert float(compute_loss(ppo, one(ln(0.6), ln(0.4), 1.0, lp_old=ln(0.4)))[0]) == pytest.approx(
        -1.28, rel=1e-6
    )
    assert float(
        compute_loss(ppo, one(ln(0.6), ln(0.4), -1.0, lp_old=ln(0.4)))[0]
    ) == pytest.approx(1.5, rel=1e-6)
    # dual clip c=1.2 bounds the A<0 loss at 1.2 * |A|
    assert float(
        compute_loss(
            dataclasses.replace(ppo, dual_clip=1.2), one(ln(0.6), ln(0.4), -1.0, lp_old=ln(0.4))
        )[0]
    ) == pytest.approx(1.2)
    # decoupled: behaviour weight .4/.1 = 4 (< cap 5) times PPO value -1.28
    assert float(
        compute_loss(LossConfig(name="decoupled_ppo"), one(ln(0.6), ln(0.1), 1.0, lp_old=ln(0.4)))[
            0
        ]
    ) == pytest.approx(-4 * 1.28, rel=1e-6)
    # score centering, head {a: p=.5 q=.4, b: p=.2 q=.3}; tail p .3 q .3 -> rho = 1
    # resid = q - p = [-.1, .1]; loss = -A (lp - sum resid lp_H) = -(ln .5 - (-.1 ln .5 + .1 ln .2))
    sc = one(ln(0.5), ln(0.4), 1.0, lp_head=[ln(0.5), ln(0.2)], lq_head=[ln(0.4), ln(0.3)])
    want = -(ln(0.5) - (-0.1 * ln(0.5) + 0.1 * ln(0.2)))
    assert float(compute_loss(LossConfig(name="score_centering"), sc)[0]) == pytest.approx(
        want, rel=1e-6
    )
    # DLC: same head, p_s = [.4, .25] on the head (tail .35); token a: r = .5/.4 = 1.25, A=1,
    # eps .28 -> pg = -1.25 (unclipped); head r = [1.25, .8] both active (A>=0, r<=1.28);
    # coefH = q r = [.5, .24]; tail: p_t .3, s_t .35, q_t .3, r_t = .3/.35 -> coefT = (.3/.3) * .857
    dl = one(
        ln(0.5),
        ln(0.4),
        1.0,
        lp_s=ln(0.4),
        lp_head=[ln(0.5), ln(0.2)],
        lq_head=[ln(0.4), ln(0.3)],
        lps_head=[ln(0.4), ln(0.25)],
    )
    coef_t = 0.3 / 0.35
    resid = np.array([0.5 - coef_t * 0.5, 0.24 - coef_t * 0.2])
    want = -1.25 + (resid * np.log([0.5, 0.2])).sum()
    assert float(compute_loss(LossConfig(name="dlc"), dl)[0]) == pytest.approx(want, rel=1e-5)


# ------------------------------------------------------------------------- special cases


def test_dlc_without_lag_equals_score_centering():
    d = make_batch()
    d0 = {**d, "lp_s": d["lp"], "lps_head": d["lp_head"]}
    l_dlc, met, g_dlc, gh_dlc = jax_loss_and_grads(LossConfig(name="dlc"), d0)
    l_sc, _, g_sc, gh_sc = jax_loss_and_grads(LossConfig(name="score_centering"), d0)
    np.testing.assert_allclose(g_dlc, g_sc, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gh_dlc, gh_sc, rtol=1e-5, atol=1e-7)
    assert float(met["clip_frac"]) == 0.0
    # values differ only by the PPO convention: pg = -A r (r = 1) vs -A lp, i.e. by agg(A (lp - 1))
    m, a = d["mask"], np.broadcast_to(d["adv"][:, None], d["mask"].shape)
    np.testing.assert_allclose(l_dlc - l_sc, (m * a * (d["lp"] - 1)).sum() / m.sum(), rtol=1e-4)


def test_dlc_with_sampler_equal_to_ps_and_full_head_is_ppo_vs_theta_s():
    d = make_batch(full_head=True, lag=0.02)  # small lag: no clipping
    d1 = {**d, "lp_q": d["lp_s"], "lq_head": d["lps_head"]}
    cfg = LossConfig(name="dlc")
    l_dlc, met, g_dlc, gh_dlc = jax_loss_and_grads(cfg, d1)
    assert float(met["clip_frac"]) == 0.0 and float(met["head_clip_frac"]) == 0.0
    l_ppo, _, g_ppo, _ = jax_loss_and_grads(
        LossConfig(name="ppo_clip"), {**d1, "lp_old": d["lp_s"]}
    )
    np.testing.assert_allclose(l_dlc, l_ppo, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_dlc, g_ppo, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gh_dlc, 0.0, atol=1e-6)  # the centering term vanishes


def test_tis_without_cap_is_full_importance_sampling():
    d = make_batch()
    loss, _, g, _ = jax_loss_and_grads(LossConfig(name="tis", tis_cap=float("inf")), d)
    m, a = d["mask"], np.broadcast_to(d["adv"][:, None], d["mask"].shape)
    w = np.exp(d["lp"] - d["lp_q"])
    np.testing.assert_allclose(loss, -(m * w * a * d["lp"]).sum() / m.sum(), rtol=1e-5)
    np.testing.assert_allclose(g, -m * w * a / m.sum(), rtol=1e-5)
    assert w[m > 0].max() > 1.3  # the cap would have been active


@pytest.mark.parametrize(
    "name,cfg_over",
    [
        ("score_centering", {}),
        ("score_centering_tis", {"tis_cap": 1.1}),
        ("score_centering_mask", {"mis_low": 0.9, "mis_high": 1.1}),
    ],
)
def test_centered_gradient_has_zero_expectation_under_q(name, cfg_over):
    """One prefix, logits theta as parameters, head = whole vocabulary, constant advantage:
    sum_a q_a grad_theta loss(a) = 0 exactly (expectation over every possible sampled token)."""
    rng = np.random.default_rng(7)
    v = 9
    theta0 = jnp.asarray(rng.normal(size=v), jnp.float32)
    lq = jax.nn.log_softmax(theta0 + jnp.asarray(rng.normal(size=v) * 0.4, jnp.float32))
    ls = jax.nn.log_softmax(theta0 + jnp.asarray(rng.normal(size=v) * 0.2, jnp.float32))
    cfg = LossConfig(name=name, **cfg_over)

    def loss_for(theta, a, adv):
        lp = jax.nn.log_softmax(theta)
        inp = LossInputs(
            lp=lp[a][None, None],
            lp_q=lq[a][None, None],
            lp_s=ls[a][None, None],
            mask=jnp.ones((1, 1)),
            adv=jnp.array([adv]),
            lp_head=lp[None, None],
            lq_head=lq[None, None],
            lps_head=ls[None, None],
        )
        return compute_loss(cfg, inp)[0]

    q = np.exp(np.asarray(lq))
    grad_fn = jax.jit(jax.vmap(jax.grad(loss_for), in_axes=(None, 0, None)))
    for adv in (1.0, -0.7):
        grads = np.asarray(grad_fn(theta0, jnp.arange(v), adv))  # [V sampled tokens, V logits]
        expect = (q[:, None] * grads).sum(0)
        assert np.abs(grads).max() > 1e-2
        np.testing.assert_allclose(expect, 0.0, atol=2e-6)


def test_uncentered_gradient_is_biased_under_q():
    """Control for the test above: naive REINFORCE has nonzero expected gradient under q != p."""
    rng = np.random.default_rng(7)
    theta0 = jnp.asarray(rng.normal(size=9), jnp.float32)
    lq = jax.nn.log_softmax(theta0 + jnp.asarray(rng.normal(size=9) * 0.4, jnp.float32))

    def loss_for(theta, a):
        lp = jax.nn.log_softmax(theta)
        return compute_loss(
            LossConfig(name="naive"),
            LossInputs(
                lp=lp[a][None, None], lp_q=lq[a][None, None], mask=jnp.ones((1, 1)), adv=jnp.ones(1)
            ),
        )[0]

    q = np.exp(np.asarray(lq))
    expect = sum(q[a] * np.asarray(jax.grad(loss_for)(theta0, a)) for a in range(9))
    assert np.abs(expect).max() > 1e-2


def test_dlc_without_head_reports_missing_centering():
    d = make_batch()
    jax_loss_and_grads(
        LossConfig(name="dlc"), d, lp_head=d["lp_head"], lq_head=d["lq_head"]
    )  # sanity: full head works
    inp = to_inputs(d, lp_head=None, lq_head=None, lps_head=None)
    loss, met = compute_loss(LossConfig(name="dlc"), inp)
    assert float(met["dlc_centering_active"]) == 0.0
    l_ppo, _ = compute_loss(
        LossConfig(name="ppo_clip"),
        to_inputs(d, lp_old=d["lp_s"], lp_head=None, lq_head=None, lps_head=None),
    )
    np.testing.assert_allclose(loss, l_ppo, rtol=1e-6)
    with pytest.raises(ValueError, match="lps_head"):
        compute_loss(LossConfig(name="dlc"), to_inputs(d, lps_head=None))


# ------------------------------------------------------------------------- bad input


def test_missing_fields_and_bad_shapes_raise():
    d = make_batch()
    with pytest.raises(ValueError, match=r"'score_centering'.*lp_head"):
        compute_loss(LossConfig(name="score_centering"), to_inputs(d, lp_head=None))
    with pytest.raises(ValueError, match=r"'dlc'.*lp_s"):
        compute_loss(LossConfig(name="dlc"), to_inputs(d, lp_s=None))
    with pytest.raises(ValueError, match="LossInputs.lp_q has shape"):
        compute_loss(LossConfig(name="tis"), to_inputs(d, lp_q=d["lp_q"][:, :2]))
    with pytest.raises(ValueError, match="LossInputs.adv"):
        compute_loss(LossConfig(name="naive"), to_inputs(d, adv=np.ones(B + 1)))
    with pytest.raises(ValueError, match="head size"):
        compute_loss(
            LossConfig(name="score_centering"), to_inputs(d, lq_head=d["lq_head"][..., :2])
        )
    with pytest.raises(ValueError, match="not a loss"):
        compute_loss(LossConfig(name="grpo"), to_inputs(d))
    with pytest.raises(ValueError, match="LossConfig.clip_low"):
        LossConfig(clip_low=1.5)
    with pytest.raises(ValueError, match="LossConfig.centering_weight"):
        LossConfig(centering_weight="clip")


@pytest.mark.parametrize("name", sorted(CFGS))
def test_all_zero_mask_gives_zero_loss_and_finite_metrics(name):
    d = make_batch()
    loss, met, g, gh = jax_loss_and_grads(CFGS[name], {**d, "mask": np.zeros((B, T))})
    assert float(loss) == 0.0 and float(met["num_tokens"]) == 0.0
    assert not np.any(g) and not np.any(gh)
    for k, v in met.items():
        assert np.isfinite(float(v)), k


@pytest.mark.parametrize("name", sorted(CFGS))
def test_nan_inputs_are_dropped_reported_or_refused(name):
    d = make_batch()
    bad = {**d, "lp_q": d["lp_q"].copy(), "lp": d["lp"].copy()}
    bad["lp_q"][1, 2] = np.nan  # valid token -> dropped + reported
    bad["lp"][0, 4] = np.nan  # padding (mask 0) -> ignored
    loss, met, g, gh = jax_loss_and_grads(CFGS[name], bad)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(g)) and np.all(np.isfinite(gh))
    assert float(met["nonfinite_tokens"]) == 1.0
    # equals the loss with that token masked out but still counted in the denominator
    m2 = d["mask"].copy()
    m2[1, 2] = 0
    ref, _, _, _ = jax_loss_and_grads(CFGS[name], {**d, "mask": m2}, num_tokens=d["mask"].sum())
    if name not in ("m2po", "mis_geo"):  # these depend on batch-level statistics of the valid set
        np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match=r"LossInputs.lp_q has 1 non-finite"):
        validate_inputs(to_inputs(bad))
    validate_inputs(to_inputs(d))  # clean batch passes (NaN on padding alone would pass too)
    validate_inputs(to_inputs({**d, "lp": bad["lp"]}))


@pytest.mark.parametrize(
    "name", ["score_centering", "score_centering_tis", "score_centering_mask", "dlc"]
)
def test_minus_inf_head_padding_equals_head_valid_mask(name):
    """A sampler that returned fewer than K candidates pads the head with -inf log-probs (prob 0);
    that must equal marking those entries invalid, and must not drop the token."""
    d = make_batch()
    pad = {k: d[k].copy() for k in ("lp_head", "lq_head", "lps_head")}
    for k in pad:
        pad[k][:, :, -1] = -np.inf
    hv = np.ones(d["lp_head"].shape)
    hv[:, :, -1] = 0
    cfg = CFGS[name]
    l_pad, m_pad, g_pad, _ = jax_loss_and_grads(cfg, {**d, **pad})
    l_hv, _, g_hv, _ = jax_loss_and_grads(cfg, {**d, "head_valid": hv})
    assert float(m_pad["nonfinite_tokens"]) == 0.0
    np.testing.assert_allclose(l_pad, l_hv, rtol=1e-6)
    np.testing.assert_allclose(g_pad, g_hv, rtol=1e-6)
    validate_inputs(to_inputs({**d, **pad}))


# ------------------------------------------------------------------ DLC edge cases (issue 12)


def _full_head_grads(cfg, lp_theta, lq, ls, adv):
    """Per sampled token a (rows), the gradient of the loss w.r.t. the logits theta (columns),
    with the head = the whole vocabulary."""

    def loss_for(theta, a):
        lp = jax.nn.log_softmax(theta)
        inp = LossInputs(
            lp=lp[a][None, None],
            lp_q=lq[a][None, None],
            lp_s=ls[a][None, None],
            lp_old=ls[a][None, None],  # PPO-clip's anchor: theta_s
            mask=jnp.ones((1, 1)),
            adv=jnp.array([adv]),
            lp_head=lp[None, None],
            lq_head=lq[None, None],
            lps_head=ls[None, None],
        )
        return compute_loss(cfg, inp)[0]

    v = lp_theta.shape[0]
    return np.asarray(
        jax.jit(jax.vmap(jax.grad(loss_for), in_axes=(None, 0)))(lp_theta, jnp.arange(v))
    )


def _ppo_mean_under_ps(cfg, lp_theta, lq, ls, adv):
    """E_{a ~ p_s}[gradient of PPO-clip against theta_s]: what DLC's centered gradient must have
    as its mean under q (the discrepancy q vs p_s removed, the clipped lag kept)."""
    ppo = dataclasses.replace(cfg, name="ppo_clip")
    grads = _full_head_grads(ppo, lp_theta, lq, ls, adv)
    return (np.exp(np.asarray(ls))[:, None] * grads).sum(0)


@pytest.mark.parametrize("adv", [1.0, -0.7])
def test_dlc_gradient_under_q_has_the_mean_of_ppo_clip_under_p_s(adv):
    """Head = whole vocabulary, constant advantage: sum_a q_a grad DLC(a) equals
    sum_a p_s,a grad PPO-clip-vs-theta_s(a) exactly, with the clip active on part of the
    vocabulary (so the clipped lag's own mean is non-zero and must be kept)."""
    rng = np.random.default_rng(7)
    v = 9
    theta0 = jnp.asarray(rng.normal(size=v), jnp.float32)
    lq = jax.nn.log_softmax(theta0 + jnp.asarray(rng.normal(size=v) * 0.4, jnp.float32))
    ls = jax.nn.log_softmax(theta0 + jnp.asarray(rng.normal(size=v) * 0.2, jnp.float32))
    cfg = LossConfig(name="dlc", clip_low=0.1, clip_high=0.1)
    r = np.exp(np.asarray(jax.nn.log_softmax(theta0) - ls))
    assert ((r > 1.1) | (r < 0.9)).any()  # the clip is active somewhere
    q = np.exp(np.asarray(lq))
    grads = _full_head_grads(cfg, theta0, lq, ls, adv)
    assert np.abs(grads).max() > 1e-2
    want = _ppo_mean_under_ps(cfg, theta0, lq, ls, adv)
    assert np.abs(want).max() > 1e-3  # non-trivial: a zero-mean centering would miss it
    np.testing.assert_allclose((q[:, None] * grads).sum(0), want, atol=2e-6)


def test_dlc_without_discrepancy_is_ppo_clip_vs_theta_s_even_when_the_lag_is_clipped():
    """q = p_s (the sampler computes exactly like the trainer): nothing to center, so DLC must be
    PPO-clip against theta_s token by token, whatever the clip does. Before the fix the centering
    term also centered the clipped lag, adding sum over clipped candidates of p_v s_v: a push that
    moves the clipped tokens further out of the trust region (the committed tiny run's DLC moved
    its policy as fast as naive REINFORCE, 3x faster than PPO-clip)."""
    d = make_batch(full_head=True, lag=0.6)  # a large lag: many ratios outside the band
    d1 = {**d, "lp_q": d["lp_s"], "lq_head": d["lps_head"]}
    cfg = LossConfig(name="dlc")
    _, met, g_dlc, gh_dlc = jax_loss_and_grads(cfg, d1)
    assert float(met["head_clip_frac"]) > 0.2  # the clip is active on the head
    _, _, g_ppo, _ = jax_loss_and_grads(LossConfig(name="ppo_clip"), {**d1, "lp_old": d["lp_s"]})
    np.testing.assert_allclose(g_dlc, g_ppo, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gh_dlc, 0.0, atol=1e-6)  # the centering term vanishes


def test_dlc_centered_gradient_with_dual_clip_has_the_mean_of_ppo_clip_under_p_s():
    """With loss.dual_clip set, tokens whose lag ratio exceeds c (A < 0) get no gradient; the
    centering term must drop the same candidates, or its mean under q is no longer PPO-clip's
    mean under p_s."""
    rng = np.random.default_rng(11)
    v = 9
    theta0 = jnp.asarray(rng.normal(size=v), jnp.float32)
    ls = jax.nn.log_softmax(theta0 + jnp.asarray(rng.normal(size=v) * 0.5, jnp.float32))
    lq = jax.nn.log_softmax(ls + jnp.asarray(rng.normal(size=v) * 0.3, jnp.float32))
    cfg = LossConfig(name="dlc", clip_low=0.1, clip_high=0.1, dual_clip=1.3)
    r = np.exp(np.asarray(jax.nn.log_softmax(theta0) - ls))
    assert (r > 1.3).any() and ((r >= 0.9) & (r <= 1.3)).any()  # the dual clip bites, not on all
    q = np.exp(np.asarray(lq))
    for adv in (-0.7, 1.0):
        grads = _full_head_grads(cfg, theta0, lq, ls, adv)
        assert np.abs(grads).max() > 1e-2
        want = _ppo_mean_under_ps(cfg, theta0, lq, ls, adv)
        np.testing.assert_allclose((q[:, None] * grads).sum(0), want, atol=2e-6)


def test_dlc_head_lag_beyond_the_safety_bound_gives_a_bounded_gradient():
    """A head candidate 24 nats more likely under theta than under theta_s: the sampled token's
    ratio is clamped at e^20 with zero gradient there, so the candidate's centering coefficient
    must be inactive too (not q * e^20, ~1e8). 3-token vocabulary, A < 0 (PPO active for r > 1)."""
    lp = jnp.log(jnp.asarray([0.4, 0.3, 0.3], jnp.float32))
    lq = jnp.log(jnp.asarray([0.5, 0.3, 0.2], jnp.float32))
    ls = jnp.asarray([np.log(0.45), np.log(0.35), np.log(0.3) - 24.0], jnp.float32)
    q = np.exp(np.asarray(lq))
    for cfg in (LossConfig(name="dlc"), LossConfig(name="dlc", dual_clip=3.0)):
        for adv in (-1.0, 1.0):
            grads = _full_head_grads(cfg, lp, lq, ls, adv)
            assert np.all(np.isfinite(grads))
            assert np.abs(grads).max() < 5.0, np.abs(grads).max()
            # consistent with the sampled token: the mean under q is still PPO-clip's under p_s
            want = _ppo_mean_under_ps(cfg, lp, lq, ls, adv)
            np.testing.assert_allclose((q[:, None] * grads).sum(0), want, atol=2e-6)
    # the raw per-head gradient of the centering term (w.r.t. lp_head) is bounded too
    d = dict(
        lp=lp[:1][None],
        lp_q=lq[:1][None],
        lp_s=ls[:1][None],
        mask=np.ones((1, 1)),
        adv=np.array([-1.0]),
        lp_head=lp[None, None],
        lq_head=lq[None, None],
        lps_head=ls[None, None],
    )
    _, met, _, gh = jax_loss_and_grads(LossConfig(name="dlc"), d)
    assert np.all(np.isfinite(gh)) and np.abs(gh).max() < 5.0
    assert float(met["head_clip_frac"]) == pytest.approx(1 / 3)  # r = .89, .86 active; e^24 not


def test_loss_specs_match_the_registry_and_the_config():
    from dlc_jax.rl import LOSS_SPECS
    from dlc_jax.rl.losses import _REGISTRY

    assert set(LOSS_SPECS) == set(LOSSES) == set(_REGISTRY)
    fields = {f.name for f in dataclasses.fields(LossConfig)} - {"name"}
    inputs = {f.name for f in dataclasses.fields(LossInputs)}
    for name, spec in LOSS_SPECS.items():
        assert _REGISTRY[name].spec is spec and LOSSES[name] is _REGISTRY[name].fn
        assert set(spec.options) <= fields, name
        assert set(spec.requires) | set(spec.together) <= inputs, name
