"""Config and plan ranges checked before use, each a one-line ConfigError / ValueError naming the
key: mesh sizes, lengths, non-finite optimizer values, YAML nesting and encoding, topology
dimensions."""

from __future__ import annotations

import pytest

from dlc_jax.plan.topology import parse_topology
from dlc_jax.trainer.config import ConfigError, load_config


@pytest.mark.parametrize(
    "override, key",
    [
        ("mesh.data=0", "mesh.data"),
        ("mesh.tensor=-2", "mesh.tensor"),
        ("sampler.max_model_len=0", "sampler.max_model_len"),
        ("optim.lr=inf", "optim.lr"),
        ("optim.lr=.nan", "optim.lr"),
        ("optim.weight_decay=nan", "optim.weight_decay"),
        ("optim.weight_decay=-1", "optim.weight_decay"),
        ("optim.eps=0", "optim.eps"),
        ("reward.clip=[1]", "reward.clip"),
        ("reward.max_failed_fraction=1.5", "reward.max_failed_fraction"),
        ("reward.window=0", "reward.window"),
        ("data.timeout_s=0", "data.timeout_s"),
        ("sampler.temperature=inf", "sampler.temperature"),
        ("sampler.retries=-1", "sampler.retries"),
        ("sampler.retry_backoff_s=-0.5", "sampler.retry_backoff_s"),
        ("sampler.retry_max_backoff_s=nan", "sampler.retry_max_backoff_s"),
    ],
)
def test_ranges_fail_in_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert msg.startswith(key) and "\n" not in msg, msg


def test_cross_field_and_allowed_values():
    with pytest.raises(ConfigError, match=r"^mesh: at most one axis may be -1"):
        load_config(None, ["mesh.data=-1"])
    with pytest.raises(ConfigError, match=r"^sampler.max_model_len: 8 leaves no room"):
        load_config(None, ["sampler.max_model_len=8", "sampler.max_tokens=8"])
    cfg = load_config(None, ["loss.tis_cap=inf", "reward.clip=[-1, 2]", "mesh.data=2"])
    assert cfg.loss.tis_cap == float("inf") and cfg.reward.clip == [-1, 2]


def test_deep_yaml_and_non_utf8_files_are_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("train: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"deep.yaml:1: nested more than 64 levels deep"):
        load_config(deep)
    with pytest.raises(ConfigError, match=r"^x: nested more than 64 levels"):
        load_config(None, ["x=" + "[" * 5000 + "]" * 5000])
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"train:\n  steps: 3\nlog:\n  wandb_run_name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin.yaml:4: not UTF-8 text"):
        load_config(latin)


@pytest.mark.parametrize(
    "bad, why",
    [
        ("v5p:0x0x0", ">= 1"),
        ("v5e:0x4", ">= 1"),
        ("v5p:3x3x3", "1, 2 or multiples of 4"),
        ("v5e:3x4", "powers of two"),
        ("v5p:64x64x64", "more than a pod"),
        ("v5p-0", "at least one chip"),
        ("v6e-1048576", "more than a pod"),
    ],
)
def test_topology_dimensions(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_topology(bad)
