"""moe.router_replay=sampler in the train step and the theta_s forward: the routed experts of the
rollouts are laid out per position, replayed, and the routing mismatch shows up in the metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from moe_helpers import MOE_UNIFORM, make_random_moe_dir

from dlc_jax.model import load_hf
from dlc_jax.model.routing import MoeSection, routed_batch, routing_mismatch
from dlc_jax.rl import LossConfig
from dlc_jax.sampler.wire.types import Rollout
from dlc_jax.trainer.batching import pack_by_tokens, pack_rollouts
from dlc_jax.trainer.config import OptimSection
from dlc_jax.trainer.state import TrainState, make_optimizer
from dlc_jax.trainer.step import StepConfig, device_batch, make_snapshot_logprobs, make_train_step

E = MOE_UNIFORM["num_experts"]


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return load_hf(make_random_moe_dir(tmp_path_factory.mktemp("m"), **MOE_UNIFORM))


def _rollouts(model, b=4, seed=0):
    """Rollouts whose routed experts are the model's own routing (what an exact sampler returns)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(b):
        p, t = 3 + i, 4 + i % 2
        seq = rng.integers(0, MOE_UNIFORM["vocab_size"], p + t).astype(np.int32)
        logits, routing = model(jnp.asarray(seq[None]), return_routing=True)
        lp = jax.nn.log_softmax(logits[0].astype(jnp.float32), -1)
        lq = np.asarray(lp[p - 1 : p + t - 1][np.arange(t), seq[p:]])
        out.append(
            Rollout(
                prompt_ids=seq[:p],
                response_ids=seq[p:],
                logprobs=lq,
                head_ids=np.zeros((t, 0), np.int32),
                head_logprobs=np.zeros((t, 0), np.float32),
                finish_reason="length",
                version_spans=[(0, 0, t)],
                slot_id=i,
                routed_experts=np.asarray(routing.experts[0, :-1]).astype(np.uint8),
            )
        )
    return out


def test_routed_batch_layout(moe_model):
    rolls = _rollouts(moe_model)
    for packed in (pack_rollouts(rolls, 16, 0), pack_by_tokens(rolls, 32, 0)):
        r = routed_batch(rolls, packed.seq_index, packed.positions)
        assert r.shape == (*packed.input_ids.shape, 2, 2)
        for i, ro in enumerate(rolls):
            rows, cols = np.nonzero(packed.seq_index == i)
            n = len(ro.routed_experts)
            assert np.array_equal(r[rows[:n], cols[:n]], ro.routed_experts)
            assert not r[rows[n:], cols[n:]].any()  # the last token: no routing
    with pytest.raises(ValueError, match="router_replay"):
        routed_batch([Rollout(**{**rolls[0].__dict__, "routed_experts": None})], r[..., 0, 0], r)
    with pytest.raises(ValueError, match="moe.router_replay"):
        MoeSection(router_replay="R3")  # type: ignore[arg-type]


def test_mismatch_metric():
    own = np.array([[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]])  # [1, 2 positions, 2 layers, 2]
    smp = np.array([[[[1, 0], [2, 4]], [[4, 5], [6, 7]]]])
    m = routing_mismatch(own, smp, np.ones((1, 2)), [True, True])
    assert (
        float(m["moe/routing_agreement_l0"]) == 1.0 and float(m["moe/routing_agreement_l1"]) == 0.75
    )
    assert float(m["moe/tokens_flipped"]) == 0.5
    m = routing_mismatch(own, smp, np.ones((1, 2)), [True, False])  # layer 1 dense: ignored
    assert float(m["moe/tokens_flipped"]) == 0.0 and "moe/routing_agreement_l1" not in m


def test_step_replays_and_reports_mismatch(moe_model):
    rolls = _rollouts(moe_model)
    arr = pack_rollouts(rolls, seq_len=16, head_k=0).arrays()
    arr.update(
        adv=np.linspace(-1, 1, len(rolls)).astype(np.float32),
        lp_s=np.zeros_like(arr["lp_q"]),
        lps_head=np.zeros_like(arr["lq_head"]),
        self_mask=np.ones(arr["mask"].shape, bool),
        routed_experts=routed_batch(rolls, arr["seq_index"], arr["positions"]),
    )
    tx = make_optimizer(OptimSection(lr=1e-3, decay="constant"), 10)
    cfg = StepConfig(loss=LossConfig(name="dlc"), head_k=0)

    def run(batch):
        st = TrainState.create(moe_model, tx)
        step = make_train_step(st.graphdef, tx, cfg)
        return step(st.params, st.opt_state, device_batch(batch))[2], st

    metrics, st = run(arr)
    assert float(metrics["loss/moe/routing_agreement"]) == 1.0
    assert float(metrics["loss/moe/tokens_flipped"]) == 0.0
    # the exact sampler's log-probs: replaying its own routing gives no mismatch at all
    lp_s, _ = make_snapshot_logprobs(st.graphdef, cfg)(st.params, device_batch(arr))
    mask = arr["mask"] > 0
    np.testing.assert_allclose(np.asarray(lp_s)[mask], arr["lp_q"][mask], atol=2e-5)
    # a sampler that routed some tokens elsewhere: the metric sees it, the step still runs
    other = dict(arr)
    flip = arr["routed_experts"].copy()
    flip[:, ::3, 0, 1] = (flip[:, ::3, 0, 0] + 1 + np.arange(flip.shape[0])[:, None]) % E
    same = flip[:, ::3, 0, 1] == flip[:, ::3, 0, 0]
    flip[:, ::3, 0, 1][same] = (flip[:, ::3, 0, 1][same] + 1) % E
    other["routed_experts"] = flip
    m2, _ = run(other)
    assert float(m2["loss/moe/routing_agreement_l0"]) < 1.0
    assert 0.0 < float(m2["loss/moe/tokens_flipped"]) < 1.0
    assert np.isfinite(float(m2["loss/loss"]))


def test_config_keys():
    from dlc_jax.trainer.config import ConfigError, default_config_path, load_config

    base = default_config_path()
    cfg = load_config(base, ["moe.router_replay=off", "mesh.expert=2"])  # YAML's bare off = false
    assert cfg.moe.router_replay == "off" and cfg.mesh.expert == 2
    assert load_config(base, ["moe.router_replay=sampler"]).moe.router_replay == "sampler"
    with pytest.raises(ConfigError, match="moe.router_replay"):
        load_config(base, ["moe.router_replay=R3"])
    with pytest.raises(ConfigError, match="moe.load_balance_loss"):
        load_config(base, ["moe.load_balance_loss=-1"])
