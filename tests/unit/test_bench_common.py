"""Benchmark plumbing: result files, markdown, targets, FLOP counts and peaks (hand-computed)."""

import dataclasses
import json

import pytest

from dlc_jax.bench import common, flops
from dlc_jax.model import Qwen3Config
from dlc_jax.model.config import ModelShape


def test_target_checks_both_directions_and_missing():
    assert common.target("a", 1.2, 1.0, ">=")["met"] is True
    assert common.target("a", 0.9, 1.0, ">=")["met"] is False
    assert common.target("b", 1.4, 1.35, "<=")["met"] is False
    assert common.target("b", None, 1.35, "<=")["met"] is None
    with pytest.raises(ValueError, match="op"):
        common.target("c", 1.0, 1.0, "==")


def test_write_result_json_and_markdown(tmp_path):
    res = common.new_result("demo", "Demo bench", ["impl", "x"])
    res["rows"] = [{"impl": "ours", "x": 1.5}, {"impl": "peer", "x": None}]
    res["targets"].append(common.target("x ratio", 1.5, 1.0, ">="))
    res = common.finish(res)
    md = common.write_result(res, tmp_path)
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["rows"][0] == {"impl": "ours", "x": 1.5}
    assert data["targets"][0]["met"] is True and data["wall_s"] >= 0
    assert (tmp_path / "demo.md").read_text() == md
    assert (
        "| ours | 1.5 |" in md and "| peer | n/a |" in md and "| x ratio | 1.5 | >= 1 | yes |" in md
    )


def test_write_result_names_missing_field(tmp_path):
    with pytest.raises(KeyError, match="rows"):
        common.write_result({"name": "x", "columns": [], "machine": {}}, tmp_path)


def test_time_interleaved_order_and_counts():
    calls = []
    out = common.time_interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, warmup=1, repeats=2
    )
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert len(out["a"]) == 2 and all(t >= 0 for t in out["b"])


def test_qwen3_flops_by_hand():
    cfg = Qwen3Config(
        vocab_size=10,
        hidden_size=4,
        intermediate_size=6,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=3,
    )
    # per layer: q 4*2*3=24, k,v 2*4*1*3=24, o 2*3*4=24, mlp 3*4*6=72 -> 144; x2 layers=288;
    # head 10*4=40
    b, t = 2, 5
    dense = 2 * b * t * (288 + 40)
    attn = 2 * 2 * 2 * b * t * t * 2 * 3
    assert flops.qwen3_forward_flops(cfg, b, t) == dense + attn
    assert flops.qwen3_train_flops(cfg, b, t) == 3 * (dense + attn)


def test_peaks_and_mfu():
    assert flops.peak_flops("cpu") is None and flops.mfu(1e9, "cpu") is None
    assert flops.peak_flops("TPU v5 lite", "bfloat16") == 197e12
    assert (
        flops.peak_flops("TPU v5p", "bfloat16") == 459e12
    )  # longest matching name wins over "TPU v5"
    assert flops.peak_flops("NVIDIA H200", "bfloat16") == 989e12
    assert flops.mfu(98.9e12, "NVIDIA H100 80GB HBM3", "bfloat16") == pytest.approx(0.1)


SHAPED_BENCHES = ("dlc_bench", "trainer_bench", "lora_bench", "sampler_bench", "weight_sync_bench")


@pytest.mark.parametrize("name", SHAPED_BENCHES)
def test_every_benchmark_takes_its_model_shape_from_the_shared_table(name):
    import importlib

    mod = importlib.import_module(f"dlc_jax.bench.{name}")
    (cls,) = {type(c) for c in mod.SIZES.values()}
    assert issubclass(cls, common.BenchShape) and issubclass(cls, ModelShape)
    dims = set(common.QWEN3_DIMS)
    assert not dims & set(cls.__annotations__), "model dims declared again: use common.BenchShape"
    widths = {
        tuple(getattr(s, k) for k in dims - {"num_hidden_layers", "vocab_size"})
        for s in common.SHAPES.values()
    }
    for size, cfg in mod.SIZES.items():
        assert tuple(getattr(cfg, k) for k in dims - {"num_hidden_layers", "vocab_size"}) in widths
        assert cfg.model_config().vocab_size == cfg.vocab_size, size
        assert dataclasses.asdict(cfg)["hidden_size"] == cfg.hidden_size  # JSON layout: flat


def test_shared_shapes_match_the_model_presets():
    from dlc_jax.model import PRESETS

    assert issubclass(Qwen3Config, ModelShape)  # one declaration of the dims: the model's
    assert not set(common.QWEN3_DIMS) & set(Qwen3Config.__annotations__)
    ref = PRESETS["Qwen3-0.6B"]
    assert {k: getattr(ref, k) for k in common.QWEN3_DIMS} == dataclasses.asdict(
        common.SHAPES["qwen3_0p6b"]
    )
    assert common.shape("tiny", num_hidden_layers=3)["num_hidden_layers"] == 3


def test_sampler_bench_push_layers_flag_sets_the_push_models_layers():
    import argparse

    from dlc_jax.bench import sampler_bench

    p = argparse.ArgumentParser()
    sampler_bench.add_args(p)
    cfg = sampler_bench.from_args("small", p.parse_args(["--push-layers", "2"]))
    assert cfg.num_hidden_layers == 2 and cfg.vocab_size == 32768
