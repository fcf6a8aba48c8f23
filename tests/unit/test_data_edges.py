"""Data at its edges, each a one-line DataError (or a clean refusal at start): rows running out with
data.epochs set, bytes that are not UTF-8 and lone surrogates in a JSONL row (named file:line), an
empty HF data set, a data.split a single saved Dataset cannot honour, a load past its deadline."""

from __future__ import annotations

import json
import time

import pytest

from dlc_jax.data.prompts import DataConfig, PromptPipeline
from dlc_jax.data.sources import DataError, open_source, with_deadline

datasets = pytest.importorskip("datasets")


class CharTok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _jsonl(path, n):
    path.write_text(
        "".join(json.dumps({"prompt": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(n))
    )
    return path


def _pipe(cfg, batch, **kw):
    return PromptPipeline(cfg, CharTok(), batch, process_index=0, process_count=1, **kw)


def test_epochs_running_out_is_one_line_not_stop_iteration(tmp_path):
    cfg = DataConfig(source=str(_jsonl(tmp_path / "d.jsonl", 5)), epochs=1)
    p = _pipe(cfg, 2)
    assert p.total_batches == 2  # 5 prompts, batches of 2: the last partial batch is dropped
    next(p), next(p)
    with pytest.raises(DataError) as e:
        next(p)
    msg = str(e.value)
    assert "\n" not in msg and "the data ran out" in msg and "lower train.steps to 2" in msg


def test_steps_that_cannot_be_reached_are_refused_at_start(tmp_path):
    cfg = DataConfig(source=str(_jsonl(tmp_path / "d.jsonl", 5)), epochs=2)
    assert _pipe(cfg, 2, steps=5).total_batches == 5  # 10 prompts over two epochs
    with pytest.raises(DataError, match=r"train.steps=6: data.epochs=2 over 5 usable prompts"):
        _pipe(cfg, 2, steps=6)
    forever = DataConfig(source=cfg.source, epochs=0)
    assert _pipe(forever, 2, steps=10**6).total_batches is None


def test_invalid_utf8_and_lone_surrogates_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "1+1", "answer": "2"}\n{"prompt": "x\xff", "answer": "1"}\n')
    with pytest.raises(DataError, match=rf"{bad}:2: not UTF-8 text \(byte 0xff at column 14\)"):
        open_source(str(bad))
    sur = tmp_path / "sur.jsonl"
    sur.write_text('{"prompt": "1+1", "answer": "2"}\n\n{"prompt": "a\\ud800", "answer": "1"}\n')
    with pytest.raises(DataError, match=rf"{sur}:3: a lone surrogate"):
        open_source(str(sur))


def test_empty_hf_dataset_is_one_line(tmp_path):
    d = tmp_path / "empty"
    datasets.Dataset.from_dict({"prompt": [], "answer": []}).save_to_disk(str(d))
    with pytest.raises(DataError, match="has no rows"):
        open_source(f"hf:{d}")


def test_split_of_a_single_saved_dataset_is_not_ignored(tmp_path):
    d = tmp_path / "one"
    datasets.Dataset.from_dict({"prompt": ["1+1"], "answer": ["2"]}).save_to_disk(str(d))
    assert len(open_source(f"hf:{d}", split="train")) == 1  # an unnamed Dataset is "train"
    with pytest.raises(DataError, match=r"data.split: 'test' cannot be selected.*single saved"):
        open_source(f"hf:{d}", split="test")


def test_a_load_past_its_deadline_is_one_line():
    t0 = time.time()
    with pytest.raises(DataError, match=r"hf:x: no answer within data.timeout_s=0.2 s"):
        with_deadline(lambda: time.sleep(30), 0.2, "hf:x")
    assert time.time() - t0 < 5
    with pytest.raises(KeyError):  # the load's own errors come through unchanged
        with_deadline(lambda: {}["k"], 5, "hf:x")


def test_data_config_ranges():
    with pytest.raises(ValueError, match="DataConfig.timeout_s"):
        DataConfig(timeout_s=0)
    with pytest.raises(ValueError, match="DataConfig.epochs"):
        DataConfig(epochs=-1)
