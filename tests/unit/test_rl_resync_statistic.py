"""resync.statistic: the token and the sequence lag ESS on hand-computed numbers, the resync
decision each gives, and the config key that picks one (issue 32 item 4)."""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import pytest

from dlc_jax.rl.effective_sample_size import ess, sequence_ess
from dlc_jax.rl.resync import resync_decision
from dlc_jax.trainer.config import ConfigError, load_config
from dlc_jax.trainer.resync import make_policy

pytestmark = pytest.mark.unit

LN2 = math.log(2.0)
# two responses of two tokens: the second response's tokens each doubled in probability
ELL = jnp.array([[0.0, 0.0], [LN2, LN2]])
MASK = jnp.ones((2, 2))


def test_token_and_sequence_ess_by_hand():
    # token weights 1, 1, 2, 2: (6)^2 / (4 * 10) = 0.9
    assert float(ess(ELL, MASK)) == pytest.approx(0.9, rel=1e-6)
    # sequence weights exp(0) = 1, exp(2 ln 2) = 4: (5)^2 / (2 * 17) = 0.7353
    assert float(sequence_ess(ELL, MASK)) == pytest.approx(25 / 34, rel=1e-6)
    # a masked-out token does not count: weights 1 | 2 -> 9 / (2 * 5) = 0.9
    assert float(sequence_ess(ELL, jnp.array([[1.0, 0.0], [1.0, 0.0]]))) == pytest.approx(0.9)


def test_resync_decision_follows_the_statistic():
    lp_s = jnp.zeros((2, 2))
    tok = resync_decision(ELL, lp_s, MASK, 0.8)
    seq = resync_decision(ELL, lp_s, MASK, 0.8, statistic="sequence")
    assert not bool(tok.resync) and float(tok.ess) == pytest.approx(0.9, rel=1e-6)
    assert bool(seq.resync) and float(seq.ess) == pytest.approx(25 / 34, rel=1e-6)
    with pytest.raises(ValueError, match="statistic"):
        resync_decision(ELL, lp_s, MASK, statistic="batch")


def test_config_key_picks_the_metric_the_policy_reads():
    cfg_path = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"
    cfg = load_config(cfg_path, ["resync.statistic=sequence", "resync.threshold=0.7"])
    pol = make_policy(cfg.resync)
    assert pol.should_resync({"ess_lag": 0.99, "ess_lag_seq": 0.6}, 1)
    assert not pol.should_resync({"ess_lag": 0.1, "ess_lag_seq": 0.75}, 1)
    with pytest.raises(KeyError, match="ess_lag_seq"):
        pol.should_resync({"ess_lag": 0.1}, 1)
    assert load_config(cfg_path).resync.statistic == "token"  # the default
    with pytest.raises(ConfigError, match="resync.statistic"):
        load_config(cfg_path, ["resync.statistic=batch"])


def test_max_interval_caps_the_ess_policy_at_k_steps():
    cfg_path = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"
    pol = make_policy(load_config(cfg_path, ["resync.max_interval=3"]).resync)
    high = {"ess_lag": 0.99}
    assert [pol.should_resync(high, n) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert pol.should_resync({"ess_lag": 0.1}, 1)  # the ESS still triggers sooner
    uncapped = make_policy(load_config(cfg_path).resync)  # the default: no cap
    assert not uncapped.should_resync(high, 10**6)
    with pytest.raises(ConfigError, match="resync.max_interval"):
        load_config(cfg_path, ["resync.max_interval=-1"])
