"""Config: shipped YAMLs load, overrides coerce types, bad keys/values are errors naming the key."""

from pathlib import Path

import pytest

from dlc_jax.trainer.config import (
    ConfigError,
    default_config_path,
    dump_config,
    load_config,
    parse_override,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", ["tiny_cpu.yaml", "qwen3_0p6b_dlc.yaml", "qwen3_1p7b_dlc.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(CONFIGS / name)
    assert cfg.loss.name == "dlc" and cfg.resync.policy == "ess"


def test_default_path_and_values():
    assert default_config_path().resolve() == (CONFIGS / "tiny_cpu.yaml").resolve()
    cfg = load_config(default_config_path())
    assert cfg.sampler.backend == "vllm" and cfg.sft.enabled and cfg.data.arithmetic.digits == 1
    assert cfg.async_.max_staleness == 16


def test_overrides_coerce_types(tmp_path):
    cfg = load_config(
        CONFIGS / "tiny_cpu.yaml",
        [
            "optim.lr=2e-4",
            "train.steps=7",
            "sampler.backend=jax",
            "log.progress=false",
            "async.prefetch=3",
            "data.arithmetic.operators=+-",
            "loss.clip_low=0.3",
            "sampler.temperature=1",
        ],
    )
    assert cfg.optim.lr == 2e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.train.steps == 7 and cfg.sampler.backend == "jax" and cfg.log.progress is False
    assert cfg.async_.prefetch == 3 and cfg.data.arithmetic.operators == "+-"
    assert cfg.loss.clip_low == 0.3 and cfg.loss.loss_config().clip_low == 0.3
    assert isinstance(cfg.sampler.temperature, float)
    # round trip through YAML
    p = tmp_path / "c.yaml"
    p.write_text(dump_config(cfg))
    assert load_config(p) == cfg


@pytest.mark.parametrize(
    "override,key",
    [
        ("optim.lrr=1", "optim.lrr"),
        ("bogus.x=1", "bogus"),
        ("train.steps=abc", "train.steps"),
        ("train.steps=1.5", "train.steps"),
        ("resync.policy=sometimes", "resync.policy"),
        ("sampler.backend=tpu", "sampler.backend"),
        ("resync.threshold=1.5", "resync.threshold"),
        ("optim.lr=-1", "optim.lr"),
        ("log.progress=maybe", "log.progress"),
        ("data.arithmetic.operators=/", "data.arithmetic"),
        ("train.micro_batches=3", "train.micro_batches"),
        ("async.max_staleness=-1", "async.max_staleness"),
        ("sampler.head_k=50", "sampler.head_k"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny_cpu.yaml", [override])
    assert str(e.value).startswith(key), str(e.value)


def test_bad_override_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_override("optim.lr")
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: 1e-3\n  betas: 3\n")
    with pytest.raises(ConfigError, match=r"^optim\.betas"):
        load_config(bad)
