"""Data sources and load-time validation: HF ``datasets`` directories the test writes (save_to_disk,
DatasetDict splits, a data-files directory), GSM8K answers, errors naming file:line / row, too-long
prompts dropped and counted, and prompts rendered with the tokenizer's own chat template."""

import json
import logging

import pytest

from dlc_jax.data.prompts import DataConfig, PromptPipeline, load_records
from dlc_jax.data.rewards import exact_match
from dlc_jax.data.sources import DataError
from dlc_jax.data.tokenize import chatml, render_prompt

datasets = pytest.importorskip("datasets")


class CharTok:
    """Independent tiny tokenizer: one id per character (ord); no chat template."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _exact_check(answers):
    return [exact_match.check_answer(a) for a in answers]


def _gsm8k_rows(n):
    return {
        "question": [f"Tom has {i} apples and buys {i + 1} more. How many?" for i in range(n)],
        "answer": [f"{i} + {i + 1} = {2 * i + 1}\n#### {2 * i + 1}" for i in range(n)],
        "level": list(range(n)),
    }


def _pipe(cfg, batch=2, tok=None, **kw):
    return PromptPipeline(
        cfg,
        tok or CharTok(),
        batch,
        process_index=kw.pop("pi", 0),
        process_count=kw.pop("pc", 1),
        **kw,
    )


def test_hf_save_to_disk_gsm8k_state_and_sharding(tmp_path):
    d = tmp_path / "gsm8k_like"
    datasets.Dataset.from_dict(_gsm8k_rows(20)).save_to_disk(str(d))
    cfg = DataConfig(
        source=f"hf:{d}",
        prompt_field="question",
        answer_field="answer",
        answer_format="gsm8k",
        seed=3,
        epochs=1,
    )
    p = _pipe(cfg, 4, answer_check=_exact_check)
    assert p.stats.rows == p.stats.used == 20 and p.stats.too_long == 0
    recs = [r for b in p for r in b]
    assert [r.slot for r in recs] == list(range(20))
    assert sorted(r.row for r in recs) == list(range(20)) and [r.row for r in recs] != list(
        range(20)
    )
    for r in recs:  # the gold answer is the number after ####; other columns travel as metadata
        assert r.answer == str(2 * r.row + 1) and r.metadata == {"level": r.row}
        assert r.prompt == f"Tom has {r.row} apples and buys {r.row + 1} more. How many?"
    # checkpointable: a fresh pipeline restored from the state after 2 batches continues identically
    q = _pipe(cfg, 4)
    first = [next(q), next(q)]
    state = json.loads(json.dumps(q.get_state()))
    r2 = _pipe(cfg, 4)
    r2.set_state(state)
    rest = [[x.row for x in b] for b in r2]
    assert [[x.row for x in b] for b in first] + rest == [
        [x.row for x in recs[i : i + 4]] for i in range(0, 20, 4)
    ]
    # per-process shards: disjoint, together every slot
    shards = [[x.slot for b in _pipe(cfg, 2, pi=i, pc=2) for x in b] for i in range(2)]
    assert shards[0] == list(range(0, 20, 2)) and shards[1] == list(range(1, 20, 2))


def test_hf_dataset_dict_splits_and_data_files_dir(tmp_path):
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"q": ["a", "b"], "a": ["1", "2"]}),
            "test": datasets.Dataset.from_dict({"q": ["c"], "a": ["3"]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    cfg = DataConfig(
        source=f"hf:{tmp_path / 'dd'}", split="test", prompt_field="q", answer_field="a"
    )
    assert load_records(cfg) == [{"prompt": "c", "answer": "3"}]
    with pytest.raises(
        DataError, match=r"data.split: 'dev' is not a split .* \(splits: \['test', 'train'\]\)"
    ):
        load_records(DataConfig(source=f"hf:{tmp_path / 'dd'}", split="dev"))
    files = tmp_path / "files"
    files.mkdir()
    (files / "train.jsonl").write_text(
        "\n".join(json.dumps({"prompt": f"p{i}", "answer": str(i)}) for i in range(3))
    )
    assert load_records(DataConfig(source=f"hf:{files}")) == [
        {"prompt": f"p{i}", "answer": str(i)} for i in range(3)
    ]


def test_data_errors_name_file_line_or_row(tmp_path):
    j = tmp_path / "d.jsonl"
    j.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": 2\n')
    with pytest.raises(DataError, match=r"d.jsonl:3: invalid JSON"):
        load_records(DataConfig(source=str(j)))
    j.write_text('{"prompt": "a", "answer": "1"}\n\n{"question": "b", "answer": "2"}\n')
    with pytest.raises(
        DataError, match=r"d.jsonl:3: no field 'prompt' \(fields: \['answer', 'question'\]\)"
    ):
        load_records(DataConfig(source=str(j)))
    j.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": ""}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: empty answer field"):
        load_records(DataConfig(source=str(j)))
    # a gold answer without a number fails at load (not mid-training), naming the line
    j.write_text(
        '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "two"}\n'
        '{"prompt": "c", "answer": "x"}\n'
    )
    with pytest.raises(
        DataError, match=r"d.jsonl:2: gold answer 'two' is not a number .*; 1 more rows like it"
    ):
        _pipe(DataConfig(source=str(j)), 1, answer_check=_exact_check)
    # GSM8K answers read raw: the error says which option fixes it
    datasets.Dataset.from_dict(_gsm8k_rows(3)).save_to_disk(str(tmp_path / "g"))
    with pytest.raises(DataError, match=r"row 0: .* set data.answer_format=gsm8k"):
        _pipe(
            DataConfig(source=f"hf:{tmp_path / 'g'}", prompt_field="question"),
            1,
            answer_check=_exact_check,
        )
    bad = _gsm8k_rows(3)
    bad["answer"][1] = "no marker here"
    datasets.Dataset.from_dict(bad).save_to_disk(str(tmp_path / "b"))
    with pytest.raises(DataError, match=r"hf:.*/b\[train\] row 1: no '####'"):
        load_records(
            DataConfig(
                source=f"hf:{tmp_path / 'b'}", prompt_field="question", answer_format="gsm8k"
            )
        )
    for source, msg in [
        (str(tmp_path / "missing.jsonl"), "data.source: no such file"),
        (f"hf:{tmp_path / 'nope'}", "data.source: no such directory"),
        (str(tmp_path / "x.csv"), "no such file"),
        (str(tmp_path), "use 'hf:"),
    ]:
        with pytest.raises(DataError, match=msg) as e:
            load_records(DataConfig(source=source))
        assert "\n" not in str(e.value)


def test_too_long_prompts_are_dropped_counted_and_logged(tmp_path, caplog):
    j = tmp_path / "d.jsonl"
    rows = [{"prompt": "x" * n, "answer": "1"} for n in (3, 9, 4, 12, 5)]
    j.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = DataConfig(source=str(j), shuffle=False, epochs=1)
    with caplog.at_level(logging.WARNING):
        p = _pipe(cfg, 1, max_prompt_tokens=5)
    assert [len(b[0].prompt) for b in p] == [3, 4, 5]
    assert p.stats.too_long == 2 and p.stats.used == 3 and p.stats.longest_prompt_tokens == 12
    assert (
        "dropped 2 of 5 prompts longer than 5 tokens" in caplog.text
        and "d.jsonl:2 (9 tokens)" in caplog.text
    )
    with pytest.raises(DataError, match="every prompt is longer than 2 tokens"):
        _pipe(cfg, 1, max_prompt_tokens=2)


QWEN3_LIKE_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def _hf_char_tokenizer(template):
    """A real HF fast tokenizer (char-level WordLevel) with ``template`` as its chat template."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{chr(c): i + 1 for i, c in enumerate(range(32, 127))}, "\n": 96}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    hf.chat_template = template
    return hf


def test_prompts_use_the_tokenizers_own_chat_template():
    tok = _hf_char_tokenizer(QWEN3_LIKE_TEMPLATE)
    on = render_prompt(tok, "2+2=", chat_template=True, system="be brief")
    off = render_prompt(tok, "2+2=", chat_template=True, system="be brief", enable_thinking=False)
    head = (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert on == head and off == head + "<think>\n\n</think>\n\n"
    assert render_prompt(tok, "2+2=", chat_template=False) == "2+2="
    # a template that differs from ChatML is used as is (not the hand-written fallback)
    tok2 = _hf_char_tokenizer("{{ messages[-1]['content'] }} => ")
    assert render_prompt(tok2, "2+2=", chat_template=True) == "2+2= => "
    # no template: the ChatML fallback
    assert render_prompt(CharTok(), "2+2=", chat_template=True, system="s") == chatml("2+2=", "s")
    # through the pipeline: ids are the tokenizer's encoding of its own rendering
    cfg = DataConfig(chat_template=True, system="be brief", enable_thinking=False, epochs=1)
    rec = next(PromptPipeline(cfg, tok, 1, process_index=0, process_count=1))[0]
    text = render_prompt(
        tok, rec.prompt, chat_template=True, system="be brief", enable_thinking=False
    )
    assert text.endswith("</think>\n\n")
    assert rec.prompt_ids.tolist() == tok.encode(text, add_special_tokens=False)
    assert 0 not in rec.prompt_ids  # no [UNK]: every character has its own id
    assert rec.prompt_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
