"""``lora.push: auto`` (the default): adapter pushes where the sampler declares it serves adapters
and serves the trainer's base, merged pushes otherwise; the resolution functions alone (no model,
no sampler)."""

import json

import pytest

from dlc_jax.lora.config import LoraConfig
from dlc_jax.lora.push import choose_push, serves_adapters
from dlc_jax.trainer.config import default_config_path, load_config
from dlc_jax.trainer.lora_push import base_issue, choose_lora_push, started_sampler_info


def test_auto_is_the_default():
    assert LoraConfig().push == "auto"
    assert load_config(default_config_path(), ["lora.rank=8"]).lora.push == "auto"


@pytest.mark.parametrize(
    ("info", "rank", "serves"),
    [
        ({"backend": "jax"}, 64, True),
        ({"backend": "inprocess"}, 8, True),
        ({"backend": "vllm", "backend_config": {"max_lora_rank": 16}}, 8, True),
        ({"backend": "vllm", "backend_config": {"max_lora_rank": 16}}, 32, False),
        ({"backend": "vllm", "backend_config": {"max_lora_rank": 0}}, 8, False),
        ({"backend": "vllm"}, 8, False),
        ({"backend": "transport-only"}, 8, False),
        ({}, 8, False),
    ],
)
def test_serves_adapters_by_what_the_sampler_declares(info, rank, serves):
    ok, why = serves_adapters(info, rank)
    assert ok is serves and why and "\n" not in why


def test_choose_push():
    jax_info, vllm_off = {"backend": "jax"}, {"backend": "vllm", "backend_config": {}}
    assert choose_push("auto", 8, jax_info) == (
        "adapter",
        "lora.push=auto: the jax sampler serves adapter pushes",
    )
    assert choose_push("auto", 8, vllm_off)[0] == "merged"
    assert "--max-lora-rank 0" in choose_push("auto", 8, vllm_off)[1]
    assert choose_push("auto", 8, jax_info, base_issue="another base") == (
        "merged",
        "lora.push=auto: another base",
    )
    # set explicitly: taken as set, whatever the sampler declares
    assert choose_push("merged", 8, jax_info) == ("merged", "lora.push=merged")
    assert choose_push("adapter", 8, vllm_off) == ("adapter", "lora.push=adapter")


def _cfg(*overrides):
    return load_config(default_config_path(), ["lora.rank=8", *overrides])


def test_choose_lora_push_for_the_run(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    spawned = started_sampler_info("vllm", 8)  # the trainer starts it with --max-lora-rank 8
    assert choose_lora_push(_cfg(), tmp_path, spawned, started_here=True)[0] == "adapter"
    # bf16 parameters: the base is the files' only when they are bf16 too
    bf16 = _cfg("model.param_dtype=bfloat16")
    assert base_issue(bf16, tmp_path, started_here=True) == ""
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    choice, why = choose_lora_push(bf16, tmp_path, spawned, started_here=True)
    assert choice == "merged" and "rounds the base" in why
    # an SFT-warmed base is served by the sampler the trainer starts, not by one started elsewhere
    sft = _cfg("sft.enabled=true")
    assert choose_lora_push(sft, tmp_path, {"backend": "jax"}, started_here=True)[0] == "adapter"
    choice, why = choose_lora_push(sft, tmp_path, {"backend": "jax"}, started_here=False)
    assert choice == "merged" and "SFT" in why
