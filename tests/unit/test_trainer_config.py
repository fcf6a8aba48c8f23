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

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


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
        ("eval.every=-1", "eval.every"),
        ("eval.temperature=-0.5", "eval.temperature"),
        ("log.samples_every=-2", "log.samples_every"),
        ("log.progress_every=0", "log.progress_every"),
        ("sft.enabled=sometimes", "sft.enabled"),
        ("base=tiny_cpu", "base"),
        ("model.attention_impl=foo", "model.attention_impl"),
        ("model.moe_impl=grouped", "model.moe_impl"),
        ("model.moe_dispatch=ring", "model.moe_dispatch"),
        ("model.remat_policy=sometimes", "model.remat_policy"),
        ("model.remat_policy=full", "model.remat_policy"),  # tiny_cpu says remat: false
        ("model.scan_layers=maybe", "model.scan_layers"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny_cpu.yaml", [override])
    assert str(e.value).startswith(key), str(e.value)


@pytest.mark.parametrize(
    "overrides,policy",
    [
        ([], "none"),
        (["model.remat=true"], "full"),
        (["model.remat_policy=save_dots"], "save_dots"),  # remat left out: the policy decides
        (["model.remat=true", "model.remat_policy=save_attn_out"], "save_attn_out"),
        (["model.remat=false", "model.remat_policy=none"], "none"),
    ],
)
def test_remat_policy_follows_remat_unless_named(overrides, policy):
    cfg = load_config(None, overrides)
    assert cfg.model.remat_policy_name() == policy
    assert cfg.model.run_options() == {
        "attention_impl": "auto",
        "scan_layers": None,
        "remat_policy": policy,
    }


def test_model_run_options_parse_and_contradictions_are_one_line(tmp_path):
    cfg = load_config(
        None, ["model.scan_layers=true", "model.attention_impl=splash", "model.remat=true"]
    )
    assert cfg.model.scan_layers is True and cfg.model.attention_impl == "splash"
    auto = load_config(None, ["model.scan_layers=null", "model.remat_policy=save_dots"])
    assert auto.model.scan_layers is None and auto.model.remat is None
    for c in (cfg, auto):  # true, null and a named policy survive the YAML round trip
        p = tmp_path / "c.yaml"
        p.write_text(dump_config(c))
        assert load_config(p) == c
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.remat=true", "model.remat_policy=none"])
    msg = str(e.value)
    assert msg.startswith("model.remat_policy: 'none' contradicts model.remat=true") and (
        "\n" not in msg
    )
    for name in ("qwen3_0p6b_dlc", "qwen3_1p7b_dlc", "qwen3_8b_dlc"):
        run = load_config(name).model.run_options()
        assert run == {"attention_impl": "auto", "scan_layers": True, "remat_policy": "full"}


def test_bad_override_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_override("optim.lr")
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: 1e-3\n  betas: 3\n")
    with pytest.raises(ConfigError, match=r"^optim\.betas"):
        load_config(bad)


def test_sft_auto_only_for_the_tiny_model():
    # the embedded default warms up the tiny model it makes, never a model the user gives
    assert load_config(default_config_path()).sft.enabled is True
    assert load_config(default_config_path(), ["model.path=/my/model"]).sft.enabled is False
    asked = load_config(default_config_path(), ["model.path=/my/model", "sft.enabled=true"])
    assert asked.sft.enabled is True
    assert load_config(None).sft.enabled is False  # the dataclass default


def test_base_layers_a_user_file_on_the_embedded_default(tmp_path):
    user = tmp_path / "mine.yaml"
    user.write_text("base: tiny_cpu\noptim: {lr: 1.0e-5}\nmodel: {path: /my/model}\n")
    cfg = load_config(user)
    tiny = load_config(default_config_path())
    assert cfg.optim.lr == 1e-5 and cfg.optim.decay == tiny.optim.decay == "constant"
    assert cfg.sampler.n == tiny.sampler.n == 8 and cfg.mesh.fsdp == 1
    assert cfg.train.steps == tiny.train.steps and cfg.sft.enabled is False
    # without a base the file starts from the dataclass defaults (a different job)
    bare = tmp_path / "bare.yaml"
    bare.write_text("optim: {lr: 1.0e-5}\n")
    assert load_config(bare).sampler.n == 4
    # a base by path, relative to the file naming it, with its own base; mappings replace whole
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "top.yaml").write_text(
        "base: ../mine.yaml\nreward: {fns: {a: {fn: dlc_jax.data.rewards:math_verify}}}\n"
        "train: {steps: 3}\n"
    )
    top = load_config(tmp_path / "sub" / "top.yaml", ["optim.warmup=2"])
    assert top.optim.lr == 1e-5 and top.train.steps == 3 and top.optim.warmup == 2
    assert list(top.reward.fns) == ["a"] and top.train.batch_prompts == tiny.train.batch_prompts


def test_base_errors_name_the_file(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("base: b.yaml\n")
    b.write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"^base: config files include each other"):
        load_config(a)
    c = tmp_path / "c.yaml"
    c.write_text("base: no_such_recipe\n")
    with pytest.raises(
        ConfigError, match=r"^base: no packaged config or file 'no_such_recipe'.*tiny_cpu"
    ):
        load_config(c)
    d = tmp_path / "d.yaml"
    d.write_text("base: tiny_cpu\noptim: {lrr: 1}\n")
    with pytest.raises(ConfigError, match=r"^optim\.lrr: unknown config key"):
        load_config(d)


def test_packaged_names_and_print_config_shows_every_key(capsys):
    from dlc_jax.trainer.cli import cli

    assert load_config("tiny_cpu") == load_config(default_config_path())
    assert cli(["--config", "qwen3_0p6b_gsm8k", "--print-config"]) == 0
    out = capsys.readouterr().out
    for key in ("clip_low:", "tail_floor:", "old_policy:", "eval:", "samples_every:", "wandb:"):
        assert key in out, key
    # every key of the dump loads back to the same config
    import yaml

    from dlc_jax.trainer.config import TrainConfig, from_dict

    assert from_dict(TrainConfig, yaml.safe_load(out)) == load_config("qwen3_0p6b_gsm8k")


def test_eval_and_log_keys_are_not_training_relevant():
    from dlc_jax.trainer.config import to_dict
    from dlc_jax.trainer.run_dir import config_diff

    a = to_dict(load_config(default_config_path()))
    b = to_dict(
        load_config(
            default_config_path(),
            ["eval.every=5", "eval.n=3", "log.samples_every=2", "log.wandb=true"],
        )
    )
    assert config_diff(a, b) == []  # a resume may switch evaluation and logging on or off
    # how the model runs may change too, but not the layer layout the checkpoint holds
    c = to_dict(
        load_config(
            default_config_path(),
            ["model.remat=true", "model.remat_policy=save_dots", "model.attention_impl=xla"],
        )
    )
    assert config_diff(a, c) == []
    d = to_dict(load_config(default_config_path(), ["model.scan_layers=true"]))
    assert [k for k, *_ in config_diff(a, d)] == ["model.scan_layers"]


def test_packed_rows_with_a_sequence_loss_are_a_one_line_user_error():
    from dlc_jax.errors import is_user_error
    from dlc_jax.trainer.step import step_config

    with pytest.raises(Exception, match=r"^train\.pack: loss\.name='mis_geo' reduces") as e:
        step_config(load_config(None, ["train.pack=true", "loss.name=mis_geo"]))
    assert is_user_error(e.value)
    assert step_config(load_config(None, ["train.pack=true", "loss.name=dlc"])).micro_batches == 1
