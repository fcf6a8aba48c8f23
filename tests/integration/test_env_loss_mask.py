"""Environment tokens (loss mask 0) never reach the math: perturbing the log-probs the sampler
reports for them (and theta_s / head values there) leaves every loss, its gradient, the step
metrics and the resync decision bitwise unchanged (issue 21)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlc_jax.rl import LossConfig, LossInputs, compute_loss, resync_decision
from dlc_jax.rl.loss_config import LOSS_NAMES
from dlc_jax.rl.metrics import step_metrics

B, T, K = 4, 12, 4


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    lp = np.log(rng.uniform(0.05, 0.9, (B, T))).astype(np.float32)
    lp_q = (lp + rng.normal(0, 0.1, (B, T))).astype(np.float32)
    lp_s = (lp + rng.normal(0, 0.1, (B, T))).astype(np.float32)
    head = np.log(rng.dirichlet(np.ones(K + 1), size=(B, T))[..., :K]).astype(np.float32)
    # env tokens: mask 0 in the middle of each row (between two generated turns) and padding
    mask = np.ones((B, T), np.float32)
    mask[:, 4:7] = 0.0
    mask[:, 10:] = 0.0
    return dict(
        lp=lp,
        lp_q=lp_q,
        lp_s=lp_s,
        lp_head=head,
        lps_head=(head + rng.normal(0, 0.05, head.shape)).astype(np.float32),
        lq_head=(head + rng.normal(0, 0.05, head.shape)).astype(np.float32),
        mask=mask,
        adv=rng.normal(size=(B,)).astype(np.float32),
    )


def _perturb(x: dict, seed: int, scale: float) -> dict:
    """The sampler's / theta_s values changed on mask-0 tokens only."""
    rng = np.random.default_rng(seed)
    off = x["mask"] == 0
    out = dict(x)
    for k in ("lp_q", "lp_s"):
        out[k] = np.where(off, x[k] + rng.normal(0, scale, x[k].shape), x[k]).astype(np.float32)
    for k in ("lq_head", "lps_head"):
        noise = rng.normal(0, scale, x[k].shape)
        out[k] = np.where(off[..., None], x[k] + noise, x[k]).astype(np.float32)
    return out


def _loss_and_grads(name: str, x: dict):
    def f(lp, lp_head):
        inp = LossInputs(
            lp=lp,
            lp_q=jnp.asarray(x["lp_q"]),
            mask=jnp.asarray(x["mask"]),
            adv=jnp.asarray(x["adv"]),
            lp_s=jnp.asarray(x["lp_s"]),
            lp_old=jnp.asarray(x["lp_s"]),
            lp_head=lp_head,
            lps_head=jnp.asarray(x["lps_head"]),
            lq_head=jnp.asarray(x["lq_head"]),
        )
        loss, metrics = compute_loss(LossConfig(name=name), inp)
        return loss, metrics

    (loss, metrics), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(
        jnp.asarray(x["lp"]), jnp.asarray(x["lp_head"])
    )
    return jax.device_get((loss, metrics, grads))


def _bitwise(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        np.testing.assert_array_equal(
            np.atleast_1d(np.asarray(u)).view(np.uint8), np.atleast_1d(np.asarray(v)).view(np.uint8)
        )


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_loss_and_gradient_ignore_env_tokens_bitwise(name):
    x = _inputs()
    base = _loss_and_grads(name, x)
    moved = _loss_and_grads(name, _perturb(x, 1, 30.0))  # large: exp() of it would overflow
    _bitwise(base, moved)


@pytest.mark.parametrize("name", ["tis", "dlc"])
def test_the_same_perturbation_on_generated_tokens_changes_the_loss(name):
    """The check above can fail: on mask-1 tokens the perturbation changes loss or gradient."""
    x = _inputs()
    everywhere = _perturb(dict(x, mask=np.zeros_like(x["mask"])), 1, 0.5)
    everywhere["mask"] = x["mask"]
    a, b = _loss_and_grads(name, x), _loss_and_grads(name, everywhere)
    assert not np.array_equal(a[0], b[0])
    assert not np.array_equal(a[2][0], b[2][0])


def test_step_metrics_and_resync_decision_ignore_env_tokens_bitwise():
    x, y = _inputs(), _perturb(_inputs(), 2, 20.0)

    def run(v):
        m = step_metrics(
            jnp.asarray(v["lp"]),
            jnp.asarray(v["lp_s"]),
            jnp.asarray(v["lp_q"]),
            jnp.asarray(v["mask"]),
            lq_head=jnp.asarray(v["lq_head"]),
            lp_head=jnp.asarray(v["lp_head"]),
        )
        d = resync_decision(jnp.asarray(v["lp"]), jnp.asarray(v["lp_s"]), jnp.asarray(v["mask"]))
        return jax.device_get((m, d.resync, d.ess))

    _bitwise(run(x), run(y))
