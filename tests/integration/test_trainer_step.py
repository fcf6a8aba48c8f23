"""Jitted train step: on-policy lag exactly zero, micro-batch accumulation, snapshot path, 8-device
FSDP x TP sharding equals single device."""

import jax
import numpy as np
import pytest
from step_helpers import random_step_batch

from dlc_jax.rl import LossConfig
from dlc_jax.trainer.config import OptimSection
from dlc_jax.trainer.state import TrainState, make_optimizer
from dlc_jax.trainer.step import StepConfig, device_batch, make_snapshot_logprobs, make_train_step


def _load(tiny_dir, mesh=None):
    from dlc_jax.model.hf_load import load_hf

    return load_hf(str(tiny_dir), mesh=mesh)


def _batch(vocab, b=8, k=4, seed=0):
    return random_step_batch(vocab, b, k, seed)


def _setup(tiny_dir, micro=1, mesh=None, lr=1e-2):
    model = _load(tiny_dir, mesh)
    tx = make_optimizer(OptimSection(lr=lr, decay="constant", grad_clip=1.0), 10)
    st = TrainState.create(model, tx, mesh=mesh)
    cfg = StepConfig(loss=LossConfig(name="dlc"), head_k=4, micro_batches=micro)
    shard = None
    if mesh is not None:
        ps = jax.tree.map(lambda x: x.sharding, st.params)
        os_ = jax.tree.map(lambda x: x.sharding, st.opt_state)
        shard = dict(mesh=mesh, param_shardings=ps, opt_shardings=os_)
    return st, tx, cfg, make_train_step(st.graphdef, tx, cfg, **(shard or {}))


def _close(a, b, tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=tol, rtol=tol)


def test_onpolicy_lag_exactly_zero_and_params_move(tiny_dir):
    st, tx, cfg, step = _setup(tiny_dir)
    vocab = st.model().config.vocab_size
    p0 = jax.tree.map(np.asarray, st.params)
    params, opt, m = step(st.params, st.opt_state, device_batch(_batch(vocab)))
    assert float(m["ess_lag"]) == 1.0 and float(m["ell_mean"]) == 0.0 and float(m["ell_std"]) == 0.0
    assert float(m["resync_wanted"]) == 0.0 and np.isfinite(float(m["loss/loss"]))
    moved = max(
        float(np.max(np.abs(np.asarray(a) - b)))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(p0))
    )
    assert moved > 1e-4


def test_micro_batches_accumulate_to_full_batch(tiny_dir):
    st1, _, _, step1 = _setup(tiny_dir, micro=1)
    st2, _, _, step2 = _setup(tiny_dir, micro=2)
    batch = device_batch(_batch(st1.model().config.vocab_size))
    p1, _, m1 = step1(st1.params, st1.opt_state, batch)
    p2, _, m2 = step2(st2.params, st2.opt_state, batch)
    np.testing.assert_allclose(float(m1["grad_norm"]), float(m2["grad_norm"]), rtol=1e-5)
    np.testing.assert_allclose(float(m1["loss/loss"]), float(m2["loss/loss"]), rtol=1e-5, atol=1e-7)
    _close(
        p1, p2, 1e-4
    )  # 1% of one Adam step (lr=1e-2): entries with near-zero gradient amplify fp noise


def test_snapshot_path_matches_self_and_detects_lag(tiny_dir):
    st, tx, cfg, step = _setup(tiny_dir, lr=5e-2)
    batch = _batch(st.model().config.vocab_size)
    snap = make_snapshot_logprobs(st.graphdef, cfg)
    lp_s, lps_head = snap(st.snapshot_params(0), device_batch(batch))
    b2 = dict(
        batch,
        lp_s=np.asarray(lp_s),
        lps_head=np.asarray(lps_head),
        self_mask=np.zeros_like(batch["self_mask"]),
    )
    pa, oa, ma = step(st.params, st.opt_state, device_batch(batch))
    pb, ob, mb = step(st.params, st.opt_state, device_batch(b2))
    np.testing.assert_allclose(float(ma["grad_norm"]), float(mb["grad_norm"]), rtol=1e-5)
    _close(pa, pb, 5e-4)  # 1% of one Adam step (lr=5e-2)
    assert abs(float(mb["ess_lag"]) - 1.0) < 1e-6
    # after a few updates the old snapshot lags: ESS < 1, ell non-zero
    params, opt = pa, oa
    for _ in range(3):
        params, opt, _ = step(params, opt, device_batch(batch))
    _, _, m = step(params, opt, device_batch(b2))
    assert float(m["ess_lag"]) < 0.999 and float(m["ell_std"]) > 1e-3


def test_fsdp_tp_on_8_fake_devices_equals_single_device(tiny_dir):
    from dlc_jax.model.sharding import MeshConfig, make_mesh

    assert len(jax.devices()) == 8
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    st1, _, _, step1 = _setup(tiny_dir)
    st8, _, _, step8 = _setup(tiny_dir, mesh=mesh, micro=2)
    raw = _batch(st1.model().config.vocab_size)
    p1, _, m1 = step1(st1.params, st1.opt_state, device_batch(raw))
    p8, _, m8 = step8(st8.params, st8.opt_state, device_batch(raw, mesh))
    assert any(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(p8))
    np.testing.assert_allclose(float(m1["loss/loss"]), float(m8["loss/loss"]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(m1["grad_norm"]), float(m8["grad_norm"]), rtol=1e-5)
    _close(p1, p8, 1e-4)  # 1% of one Adam step (lr=1e-2)


@pytest.mark.parametrize("old_policy", ["current", "sampler"])
def test_ppo_anchor_old_policy(tiny_dir, old_policy):
    """loss.old_policy picks lp_old: 'current' makes PPO-clip exactly the naive gradient (r = 1);
    'sampler' anchors at lp_q, whose ratios here are far from 1, so clipping cuts gradient and it
    differs."""
    model = _load(tiny_dir)
    tx = make_optimizer(OptimSection(lr=1e-2, decay="constant", grad_clip=0.0), 10)
    st = TrainState.create(model, tx)
    batch = device_batch(_batch(model.config.vocab_size))
    out = {}
    for name in ("naive", "ppo_clip"):
        cfg = StepConfig(loss=LossConfig(name=name), head_k=4, old_policy=old_policy)
        _, _, m = make_train_step(st.graphdef, tx, cfg)(st.params, st.opt_state, batch)
        out[name] = m
    same = abs(float(out["naive"]["grad_norm"]) - float(out["ppo_clip"]["grad_norm"])) < 1e-6
    if old_policy == "current":
        assert same and float(out["ppo_clip"]["loss/clip_frac"]) == 0.0
    else:
        assert not same and float(out["ppo_clip"]["loss/clip_frac"]) > 0.0


def test_scanned_micro_batches_equal_unrolled_loop(tiny_dir):
    """The lax.scan accumulation (4 strided micro-batches) gives the grads, per-token log-probs and
    loss of a plain Python loop over the same micro-batches; per-token outputs come back in row
    order."""
    import jax.numpy as jnp

    from dlc_jax.trainer.step import _loss_fn, accumulate_grads, split_micro_batches

    model = _load(tiny_dir)
    from flax import nnx

    graphdef, params = nnx.split(model, nnx.Param)
    cfg = StepConfig(loss=LossConfig(name="dlc"), head_k=4, micro_batches=4)
    batch = device_batch(_batch(model.config.vocab_size))
    grads, lm, lp, _, _, lp_head = jax.jit(lambda p, b: accumulate_grads(p, graphdef, b, cfg))(
        params, batch
    )
    n_tok = jnp.sum(batch["mask"])
    ref_g = jax.tree.map(jnp.zeros_like, params)
    ref_loss, ref_lp = 0.0, np.zeros(batch["mask"].shape, np.float32)
    for i in range(4):
        mb = {k: split_micro_batches(v, 4)[i] for k, v in batch.items()}
        (loss, aux), g = jax.value_and_grad(_loss_fn, has_aux=True)(
            params, graphdef, mb, n_tok, cfg
        )
        ref_g = jax.tree.map(jnp.add, ref_g, g)
        ref_loss += float(loss)
        ref_lp[i::4] = np.asarray(aux[1])
    _close(grads, ref_g, 1e-6)
    np.testing.assert_allclose(float(lm["loss"]), ref_loss, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(lp), ref_lp, atol=1e-6)
    assert lp_head.shape == batch["head_ids"].shape
    # micro-batch i holds rows i, i+4, ...: the split is its own inverse's inverse
    x = jnp.arange(8 * 3).reshape(8, 3)
    from dlc_jax.trainer.step import merge_micro_batches

    np.testing.assert_array_equal(np.asarray(split_micro_batches(x, 4)[1]), np.asarray(x[1::4]))
    np.testing.assert_array_equal(
        np.asarray(merge_micro_batches(split_micro_batches(x, 4))), np.asarray(x)
    )


def test_snapshot_forward_over_micro_batches_equals_whole_batch(tiny_dir):
    """The theta_s forward maps over the step's micro-batches; rows in order, values equal."""
    model = _load(tiny_dir)
    from flax import nnx

    graphdef, params = nnx.split(model, nnx.Param)
    batch = device_batch(_batch(model.config.vocab_size))
    outs = [
        make_snapshot_logprobs(
            graphdef, StepConfig(loss=LossConfig(name="dlc"), head_k=4, micro_batches=m)
        )(params, batch)
        for m in (1, 4)
    ]
    for a, b in zip(outs[0], outs[1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_optimizer_moments_sharded_like_params(tiny_dir):
    """On a mesh, Adam's mu/nu take their parameter's sharding (not one device, not replicated)."""
    from dlc_jax.model.sharding import MeshConfig, make_mesh

    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    st, _, _, _ = _setup(tiny_dir, mesh=mesh)
    adam = st.opt_state[1][0]
    for p, mu, nu in zip(*(jax.tree.leaves(t) for t in (st.params, adam.mu, adam.nu))):
        assert mu.sharding.is_equivalent_to(p.sharding, p.ndim), (mu.sharding, p.sharding)
        assert nu.sharding.is_equivalent_to(p.sharding, p.ndim)
    assert any(
        len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
        for x in jax.tree.leaves(adam.mu)
    )
