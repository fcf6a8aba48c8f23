"""LoRA adapters (dlc_jax.lora): placement by path, merge parity, adapter-only training, snapshots
and checkpoints with the base fingerprint, config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_helpers import LORA_DIMS
from step_helpers import random_step_batch

from dlc_jax.lora import (
    LoraConfig,
    LoraParam,
    adapter_parameter_count,
    apply_lora,
    base_fingerprint,
    base_meta,
    check_base,
    merged_model,
)
from dlc_jax.model.config import Qwen3Config
from dlc_jax.model.qwen3 import Qwen3ForCausalLM
from dlc_jax.rl import LossConfig
from dlc_jax.trainer.config import OptimSection
from dlc_jax.trainer.state import TrainState, make_optimizer
from dlc_jax.trainer.step import StepConfig, device_batch, make_train_step

DIMS = LORA_DIMS


def _model(scan=False, seed=0):
    return Qwen3ForCausalLM(Qwen3Config(**DIMS, scan_layers=scan), rngs=nnx.Rngs(seed))


def _randomize_b(model, scale=0.2):
    """Non-zero B factors (a trained adapter), so the delta is not zero."""
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(model, LoraParam))):
        x = v.get_value()
        v.set_value(scale * jax.random.normal(jax.random.key(i), x.shape, x.dtype))


IDS = jnp.arange(14, dtype=jnp.int32).reshape(2, 7) % DIMS["vocab_size"]


@pytest.mark.parametrize("scan", [False, True])
def test_adapters_on_every_projection_start_at_zero_and_merge_exactly(scan):
    m = _model(scan)
    base = m(IDS)
    paths = apply_lora(m, LoraConfig(rank=4, alpha=8.0))
    per_layer = 7  # q k v o gate up down
    assert len(paths) == per_layer * (1 if scan else DIMS["num_hidden_layers"])
    assert not any("lm_head" in p or "embed" in p for p in paths)
    # B = 0: the delta is 0 (bit-exact when looped; a scan body fuses differently, ~1 ulp)
    np.testing.assert_allclose(np.asarray(m(IDS)), np.asarray(base), atol=1e-7 if scan else 0)
    _randomize_b(m)
    adapted_logits = m(IDS)
    assert float(jnp.max(jnp.abs(adapted_logits - base))) > 1e-2
    merged = merged_model(m)
    assert adapter_parameter_count(merged) == 0
    np.testing.assert_allclose(np.asarray(merged(IDS)), np.asarray(adapted_logits), atol=2e-5)
    np.testing.assert_array_equal(np.asarray(m(IDS)), np.asarray(adapted_logits))  # m untouched


def test_adapter_shapes_and_count_follow_the_kernels():
    m = _model()
    apply_lora(m, LoraConfig(rank=3, targets="q_proj,down_proj"))
    q = m.model.layers[0].self_attn.q_proj
    assert q.lora.a.get_value().shape == (32, 3) and q.lora.b.get_value().shape == (3, 4, 8)
    d = m.model.layers[1].mlp.down_proj
    assert d.lora.a.get_value().shape == (48, 3) and d.lora.b.get_value().shape == (3, 32)
    assert getattr(m.model.layers[0].self_attn.k_proj, "lora", None) is None
    per_layer = 32 * 3 + 3 * 32 + 48 * 3 + 3 * 32
    assert adapter_parameter_count(m) == 2 * per_layer


def test_bad_targets_and_options_name_the_key():
    with pytest.raises(ValueError, match="lora.targets.*matches no projection"):
        apply_lora(_model(), LoraConfig(rank=2, targets="q_porj"))
    with pytest.raises(ValueError, match="targets.*lm_head"):
        LoraConfig(rank=2, targets="q_proj,lm_head")
    with pytest.raises(ValueError, match="dropout"):
        LoraConfig(rank=2, dropout=1.0)
    from dlc_jax.trainer.config import default_config_path, load_config
    from dlc_jax.trainer.config_sections import ConfigError

    with pytest.raises(ConfigError, match=r"^lora\.rank: "):
        load_config(default_config_path(), ["lora.rank=-1"])
    with pytest.raises(ConfigError, match=r"^lora\.push: "):
        load_config(default_config_path(), ["lora.push=adapterz"])
    cfg = load_config(default_config_path(), ["lora.rank=8", "lora.alpha=16"])
    assert cfg.lora.enabled and cfg.lora.scale == 2.0


def _batch(vocab, b=8, k=4, seed=0):
    return device_batch(random_step_batch(vocab, b, k, seed))


def _lora_state(rank=4, lr=1e-2):
    m = _model()
    apply_lora(m, LoraConfig(rank=rank))
    tx = make_optimizer(OptimSection(lr=lr, decay="constant", grad_clip=1.0), 10)
    st = TrainState.create(m, tx, trainable=LoraParam)
    cfg = StepConfig(loss=LossConfig(name="dlc"), head_k=4)
    return st, tx, cfg, make_train_step(st.graphdef, tx, cfg, trainable=LoraParam)


def _flat(state):
    return {p: v.get_value() for p, v in nnx.to_flat_state(state)}


def test_only_adapters_train_and_only_they_have_optimizer_state():
    from dlc_jax.trainer.state import split_trainable
    from dlc_jax.trainer.step import accumulate_grads

    st, tx, cfg, step = _lora_state()
    n_adapter = adapter_parameter_count(st.model())
    moments = [x for x in jax.tree.leaves(st.opt_state) if getattr(x, "ndim", 0) > 0]
    assert sum(int(np.prod(x.shape)) for x in moments) == 2 * n_adapter  # Adam mu + nu only
    batch = _batch(DIMS["vocab_size"])
    before = _flat(st.params)
    params, opt, _ = step(st.params, st.opt_state, batch)
    after = _flat(params)
    assert set(after) == set(before)
    lora_keys = {p for p in before if p[-2:] in (("lora", "a"), ("lora", "b"))}
    assert len(lora_keys) == 2 * 7 * 2
    for p in before:
        if p in lora_keys:
            continue
        assert after[p] is before[p]  # the frozen base: the very same arrays, never copied
    assert any(not np.array_equal(np.asarray(after[p]), np.asarray(before[p])) for p in lora_keys)
    # the adapters' gradients are those of the full-parameter loss (the frozen join is exact)
    train, frozen = split_trainable(params, LoraParam)
    pg = StepConfig(loss=LossConfig(name="naive"))  # any loss: the cheapest to compile
    g_lora = jax.jit(lambda t, f: accumulate_grads(t, st.graphdef, batch, pg, f)[0])(train, frozen)
    g_full = jax.jit(lambda p: accumulate_grads(p, st.graphdef, batch, pg)[0])(params)
    full = _flat(g_full)
    for p, g in _flat(g_lora).items():
        np.testing.assert_allclose(np.asarray(g), np.asarray(full[p]), atol=1e-6)
    assert max(float(np.abs(np.asarray(g)).max()) for g in _flat(g_lora).values()) > 1e-3


def test_snapshots_hold_adapters_only_and_rebuild_theta_s():
    st, _, _, step = _lora_state()
    batch = _batch(DIMS["vocab_size"])
    v0 = st.version
    assert all(p[-2] == "lora" for p, _ in nnx.to_flat_state(st.snapshots[v0]))
    logits0 = st.model()(IDS)
    st.params, st.opt_state, _ = step(st.params, st.opt_state, batch)
    st.step += 1
    st.snapshot()
    assert sorted(st.snapshots) == [v0, v0 + 1]
    np.testing.assert_array_equal(np.asarray(st.model_at(v0)(IDS)), np.asarray(logits0))
    np.testing.assert_array_equal(np.asarray(st.model_at(v0 + 1)(IDS)), np.asarray(st.model()(IDS)))


def test_checkpoint_holds_adapters_only_and_refuses_another_base(tmp_path):
    from dlc_jax.trainer.checkpoint import Checkpointer, restore_train_state, save_train_state

    st, _, _, step = _lora_state()
    st.params, st.opt_state, _ = step(st.params, st.opt_state, _batch(DIMS["vocab_size"]))
    st.step = 1
    st.snapshot()
    fp = base_fingerprint(st.params)
    ck = Checkpointer(tmp_path / "ck", keep=2)
    assert save_train_state(ck, st, base_meta(fp), force=True)
    saved = ck.restore_meta(1)
    params_sums = [k for k in saved["checksums"] if k.startswith("['params']")]
    assert params_sums and all("'lora'" in k for k in params_sums)

    fresh, _, _, _ = _lora_state()
    assert base_fingerprint(fresh.params) == fp  # the same base (same seed), other adapters
    meta = restore_train_state(ck, fresh, check_meta=lambda m: check_base(m, fp, "ck"))
    assert meta[next(iter(base_meta(fp)))] == fp
    np.testing.assert_array_equal(np.asarray(fresh.model()(IDS)), np.asarray(st.model()(IDS)))
    assert sorted(fresh.snapshots) == sorted(st.snapshots)

    other = _model(seed=1)
    apply_lora(other, LoraConfig(rank=4))
    other_fp = base_fingerprint(nnx.state(other, nnx.Param))
    assert other_fp != fp
    with pytest.raises(Exception, match="trained on base"):
        check_base(saved, other_fp, "ck")
    with pytest.raises(Exception, match="lora.rank"):
        check_base(saved, None, "ck")
