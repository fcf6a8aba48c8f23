"""HF checkpoint round trip: export -> transformers, multi-file shards, errors naming the tensor."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import CONFIG_TIED, CONFIG_UNTIED, hf_logits, make_random_hf_dir, padded_batch
from safetensors.numpy import load_file, save_file

from dlc_jax.model import CheckpointError, hf_param_shapes, iter_hf_tensors, load_hf, save_hf


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return make_random_hf_dir(tmp_path_factory.mktemp("untied"), seed=3, **CONFIG_UNTIED)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return make_random_hf_dir(tmp_path_factory.mktemp("tied"), seed=4, **CONFIG_TIED)


def _all_tensors(d):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.parametrize("which", ["untied", "tied"])
def test_export_reload_transformers_identical(which, untied, tied, tmp_path):
    src = untied if which == "untied" else tied
    model = load_hf(src)
    out = save_hf(model, tmp_path / "exp", max_shard_bytes=60_000)  # force several shard files
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and (out / "model.safetensors.index.json").exists()
    a, b = _all_tensors(src), _all_tensors(out)
    assert set(b) == set(hf_param_shapes(model.config))
    assert ("lm_head.weight" in b) == (which == "untied")
    for k in b:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    ids, mask = padded_batch(model.config.vocab_size, seed=9)
    np.testing.assert_array_equal(hf_logits(out, ids, mask), hf_logits(src, ids, mask))
    # and the sharded export loads back into our model with identical logits
    np.testing.assert_array_equal(np.asarray(load_hf(out)(ids, mask)), np.asarray(model(ids, mask)))


@pytest.mark.parametrize("which", ["untied", "tied"])
def test_scanned_load_and_export_bit_identical(which, untied, tied):
    src = untied if which == "untied" else tied
    loop, scan = load_hf(src, scan_layers=False), load_hf(src, scan_layers=True)
    assert scan.scanned and not loop.scanned
    q = scan.model.layers.self_attn.q_proj.kernel.get_value()
    assert q.shape[0] == scan.config.num_hidden_layers  # one stacked [L, ...] parameter
    a, b = list(iter_hf_tensors(loop)), list(iter_hf_tensors(scan))
    assert [n for n, _ in a] == [n for n, _ in b] == list(hf_param_shapes(scan.config))
    originals = _all_tensors(src)
    for (name, x), (_, y) in zip(a, b):
        np.testing.assert_array_equal(x, y, err_msg=name)
        np.testing.assert_array_equal(y, originals[name], err_msg=name)
    bf_a = dict(iter_hf_tensors(loop, dtype=jnp.bfloat16))
    for name, y in iter_hf_tensors(scan, dtype=jnp.bfloat16):
        assert y.dtype == bf_a[name].dtype and y.tobytes() == bf_a[name].tobytes(), name


def test_bf16_export_and_iter(untied, tmp_path):
    model = load_hf(untied)
    names = [n for n, _ in iter_hf_tensors(model)]
    assert names == list(hf_param_shapes(model.config))
    shapes = dict((n, a.shape) for n, a in iter_hf_tensors(model))
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (8 * 16, 64)
    out = save_hf(model, tmp_path / "bf16", dtype=jnp.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids, mask = padded_batch(257, seed=10)
    err = np.abs(hf_logits(m, ids, mask) - hf_logits(untied, ids, mask))[mask.astype(bool)].max()
    assert 0 < err < 0.5, err  # bf16 rounding, not garbage


def test_param_dtype_and_compute_dtype(untied):
    model = load_hf(untied, param_dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    assert model.model.layers[0].self_attn.q_proj.kernel.get_value().dtype == jnp.bfloat16
    ids, mask = padded_batch(257, seed=11)
    out = model(ids, mask)
    assert out.dtype == jnp.bfloat16
    ref = hf_logits(untied, ids, mask)
    err = np.abs(np.asarray(out, np.float32) - ref)[mask.astype(bool)].max()
    assert err < 0.5, err


def _copy_dir(src, dst, mutate):
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    t = _all_tensors(src)
    mutate(t)
    save_file(t, str(dst / "model.safetensors"))
    return dst


def test_missing_misshaped_unexpected_tensor_errors(untied, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    d = _copy_dir(untied, tmp_path / "missing", lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        load_hf(d)

    def reshape(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float32)

    d = _copy_dir(untied, tmp_path / "shape", reshape)
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight.*\(16, 64\)"
    ):
        load_hf(d)

    def extra(t):
        t["model.layers.7.mlp.up_proj.weight"] = np.zeros((2, 2), np.float32)

    d = _copy_dir(untied, tmp_path / "extra", extra)
    with pytest.raises(CheckpointError, match=r"unexpected.*model\.layers\.7"):
        load_hf(d)


def test_multi_file_checkpoint_from_transformers(untied, tmp_path):
    """A checkpoint sharded by transformers itself (index + several files) loads."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(untied, dtype=torch.float32)
    m.save_pretrained(tmp_path / "multi", max_shard_size="40KB")
    assert len(list((tmp_path / "multi").glob("*.safetensors"))) > 2
    ids, mask = padded_batch(257, seed=12)
    ours = np.asarray(load_hf(tmp_path / "multi")(ids, mask))
    err = np.abs(ours - hf_logits(m, ids, mask))[mask.astype(bool)].max()
    assert err <= 1e-4, err


def test_tokenizer_files_copied(tmp_path):
    from dlc_jax.model import make_tiny

    src = make_tiny(tmp_path / "tiny", num_hidden_layers=1)
    out = save_hf(load_hf(src), tmp_path / "exp")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / f).read_bytes() == (src / f).read_bytes(), f
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"
