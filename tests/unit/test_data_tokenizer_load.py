"""`load_tokenizer` loads the class AutoTokenizer would pick, directly where that class is known
(no AutoTokenizer import: ~4 CPU-s less per process), and through AutoTokenizer otherwise; the two
give the same tokenizer: class, ids, special tokens, chat template rendering, decoding."""

from __future__ import annotations

import json
import shutil

import pytest

from dlc_jax.data.tokenize import _direct_tokenizer_class, load_tokenizer

TEXTS = ["12+7=", " hello world\n", "<|im_start|>user\n3*4<|im_end|>\n", "ünïcödé 😀 x"]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]


def _variant(tiny_dir, tmp_path, name: str, **tok_cfg) -> str:
    d = tmp_path / name
    shutil.copytree(tiny_dir, d)
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tok_cfg)
    cfg_path.write_text(json.dumps(cfg))
    return str(d)


def _same(a, b) -> None:
    assert type(a) is type(b)
    for t in TEXTS:
        assert a(t)["input_ids"] == b(t)["input_ids"], t
        ids = a(t)["input_ids"]
        assert a.decode(ids) == b.decode(ids)
        assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)
    for attr in (
        "eos_token_id",
        "pad_token_id",
        "bos_token_id",
        "all_special_ids",
        "chat_template",
    ):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert a.get_added_vocab() == b.get_added_vocab()
    if a.chat_template:
        for gen in (True, False):
            kw = dict(tokenize=True, add_generation_prompt=gen)
            assert a.apply_chat_template(MESSAGES, **kw) == b.apply_chat_template(MESSAGES, **kw)


@pytest.mark.parametrize("cls_name", [None, "Qwen2Tokenizer", "Qwen2TokenizerFast"])
def test_direct_load_equals_autotokenizer(tiny_dir, tmp_path, cls_name):
    from transformers import AutoTokenizer

    d = (
        str(tiny_dir)
        if cls_name is None
        else _variant(tiny_dir, tmp_path, cls_name, tokenizer_class=cls_name)
    )
    assert _direct_tokenizer_class(d) is not None  # the fast path is taken
    _same(load_tokenizer(d), AutoTokenizer.from_pretrained(d, local_files_only=True))


def test_unknown_cases_go_through_autotokenizer(tiny_dir, tmp_path):
    remote = _variant(tiny_dir, tmp_path, "remote", auto_map={"AutoTokenizer": ["x.Y", None]})
    assert _direct_tokenizer_class(remote) is None
    other = _variant(tiny_dir, tmp_path, "llama")
    cfg = json.loads((tmp_path / "llama" / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(json.dumps(dict(cfg, model_type="llama")))
    assert _direct_tokenizer_class(other) is None
    unnamed = _variant(tiny_dir, tmp_path, "unnamed", tokenizer_class="LlamaTokenizer")
    assert _direct_tokenizer_class(unnamed) is None
    # and the AutoTokenizer path still loads it
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(unnamed, local_files_only=True)
    _same(load_tokenizer(unnamed), auto)


def test_missing_directory_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="cannot load a tokenizer from model dir"):
        load_tokenizer(str(tmp_path / "nope"))
