"""Data: arithmetic determinism, grain prompt pipeline (slots, shuffle, shard, state), files."""

import json

import numpy as np
import pytest

from dlc_jax.data.arithmetic import ArithmeticConfig, ArithmeticSource, arithmetic_example
from dlc_jax.data.prompts import DataConfig, PromptPipeline, load_records
from dlc_jax.data.sources import DataError


class CharTok:
    """Independent tiny tokenizer: one id per character (ord)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_arithmetic_is_deterministic_and_correct():
    cfg = ArithmeticConfig(digits=2, operators="+-*", num_examples=50)
    a = [arithmetic_example(cfg, 3, i) for i in range(50)]
    b = [ArithmeticSource(cfg, 3)[i] for i in range(50)]
    assert a == b
    assert a != [arithmetic_example(cfg, 4, i) for i in range(50)]
    for ex in a:
        assert ex["prompt"].endswith("=")
        assert int(ex["answer"]) == eval(ex["prompt"][:-1])  # independent check of the arithmetic
        assert int(ex["answer"]) >= 0
    assert {ex["prompt"][len(ex["prompt"].rstrip("=0123456789")) - 1] for ex in a} <= set("+-*")
    with pytest.raises(ValueError, match="operators"):
        ArithmeticConfig(operators="/")


def _drain(p, n):
    return [[(r.slot, r.prompt) for r in next(p)] for _ in range(n)]


def test_pipeline_slots_epochs_shuffle_and_state():
    cfg = DataConfig(seed=5, arithmetic=ArithmeticConfig(num_examples=12), epochs=2)
    p = PromptPipeline(cfg, CharTok(), batch_prompts=4, process_index=0, process_count=1)
    batches = _drain(p, 6)  # 2 epochs x 12 / 4
    with pytest.raises(StopIteration):
        next(p)
    slots = [s for b in batches for s, _ in b]
    assert slots == list(range(24))  # slot = position in epoch order
    prompts = [x for b in batches for _, x in b]
    src = [ArithmeticSource(cfg.arithmetic, 5)[i]["prompt"] for i in range(12)]
    assert sorted(prompts[:12]) == sorted(src) and sorted(prompts[12:]) == sorted(
        src
    )  # each epoch a permutation
    assert prompts[:12] != src  # shuffled
    assert prompts[:12] != prompts[12:]  # reshuffled per epoch
    # determinism and state round trip
    q = PromptPipeline(cfg, CharTok(), batch_prompts=4, process_index=0, process_count=1)
    assert _drain(q, 2) == batches[:2]
    state = json.loads(json.dumps(q.get_state()))
    r = PromptPipeline(cfg, CharTok(), batch_prompts=4, process_index=0, process_count=1)
    r.set_state(state)
    assert _drain(r, 4) == batches[2:]
    rec = batches and PromptPipeline(cfg, CharTok(), 1, process_index=0, process_count=1)
    first = next(rec)[0]
    assert (
        first.prompt_ids.dtype == np.int32 and "".join(map(chr, first.prompt_ids)) == first.prompt
    )


def test_pipeline_shards_by_process_disjointly():
    cfg = DataConfig(seed=1, arithmetic=ArithmeticConfig(num_examples=16), epochs=1)
    shards = [PromptPipeline(cfg, CharTok(), 2, process_index=i, process_count=2) for i in range(2)]
    s0 = [r.slot for b in shards[0] for r in b]
    s1 = [r.slot for b in shards[1] for r in b]
    assert s0 == list(range(0, 16, 2)) and s1 == list(range(1, 16, 2))


def test_pipeline_reads_jsonl_and_parquet_with_custom_fields(tmp_path):
    rows = [{"question": f"q{i}", "sol": f"#### {i}"} for i in range(6)]
    j = tmp_path / "d.jsonl"
    j.write_text("\n".join(json.dumps(r) for r in rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pqf = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pqf)
    for path in (j, pqf):
        cfg = DataConfig(
            source=str(path), prompt_field="question", answer_field="sol", shuffle=False, epochs=1
        )
        got = [
            (r.slot, r.prompt, r.answer)
            for b in PromptPipeline(cfg, CharTok(), 3, process_index=0, process_count=1)
            for r in b
        ]
        assert got == [(i, f"q{i}", f"#### {i}") for i in range(6)]
    with pytest.raises(DataError, match=r"d.jsonl:1: no field 'prompt'"):
        load_records(DataConfig(source=str(j)))
    with pytest.raises(DataError, match="data.source: no such file"):
        load_records(DataConfig(source=str(tmp_path / "missing.jsonl")))


def test_chatml_wrapping():
    cfg = DataConfig(
        chat_template=True, system="be brief", epochs=1, arithmetic=ArithmeticConfig(num_examples=2)
    )
    rec = next(PromptPipeline(cfg, CharTok(), 1, process_index=0, process_count=1))[0]
    text = "".join(map(chr, rec.prompt_ids))
    assert (
        text == "<|im_start|>system\nbe brief<|im_end|>\n"
        f"<|im_start|>user\n{rec.prompt}<|im_end|>\n<|im_start|>assistant\n"
    )
