"""Grain prompt pipeline: local JSONL/Parquet files or the synthetic arithmetic task.

Order of operations (all on a ``grain.MapDataset``, so it is random-access and checkpointable):
source -> shuffle(seed) (reshuffled every epoch) -> repeat(epochs) -> attach the global **slot id**
(position in the epoch order: ``epoch * N + position``) -> shard by JAX process
(``slots[process_index::process_count]``) -> tokenize -> ``to_iter_dataset`` -> batch into groups of
``batch_prompts`` prompts. The iterator's ``get_state()/set_state()`` is a small JSON-able dict.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import grain
import numpy as np

from dlc_jax.data.arithmetic import ArithmeticConfig, ArithmeticSource
from dlc_jax.data.tokenize import encode_prompt


@dataclasses.dataclass
class DataConfig:
    """Where prompts come from and how they are ordered.

    source: "arithmetic" (synthetic, local) or a path to a ``.jsonl`` / ``.parquet`` file.
    prompt_field / answer_field: record field names in the file.
    seed: shuffle seed; shuffle: whether to shuffle; epochs: passes over the data (0 = forever).
    chat_template: wrap prompts in ChatML; system: optional system prompt for ChatML.
    """

    source: str = "arithmetic"
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    seed: int = 0
    shuffle: bool = True
    epochs: int = 0
    chat_template: bool = False
    system: str = ""
    arithmetic: ArithmeticConfig = dataclasses.field(default_factory=ArithmeticConfig)


@dataclasses.dataclass
class PromptRecord:
    """One prompt with its stable global slot id. ``prompt_ids`` is int32 [P]."""

    slot: int
    prompt: str
    answer: str
    prompt_ids: np.ndarray


def _field(rec: dict, name: str, path: str, i: int):
    if name not in rec:
        raise KeyError(f"{path}: record {i} has no field {name!r} (fields: {sorted(rec)}); set data.prompt_field/answer_field")
    return rec[name]


def load_records(cfg: DataConfig) -> list[dict] | ArithmeticSource:
    """Random-access records ``{"prompt", "answer"}`` from the configured source."""
    if cfg.source == "arithmetic":
        return ArithmeticSource(cfg.arithmetic, seed=cfg.seed)
    path = Path(cfg.source)
    if not path.exists():
        raise FileNotFoundError(f"data.source: no such file {cfg.source!r}")
    if path.suffix == ".jsonl":
        raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        raw = pq.read_table(path).to_pylist()
    else:
        raise ValueError(f"data.source: unsupported file type {path.suffix!r} (use .jsonl or .parquet)")
    if not raw:
        raise ValueError(f"data.source: {cfg.source!r} has no records")
    return [
        {"prompt": str(_field(r, cfg.prompt_field, cfg.source, i)), "answer": str(_field(r, cfg.answer_field, cfg.source, i))}
        for i, r in enumerate(raw)
    ]


def slot_dataset(cfg: DataConfig, *, process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
    """MapDataset of ``(slot, record)`` for this process, before tokenization."""
    ds = grain.MapDataset.source(load_records(cfg))
    if cfg.shuffle:
        ds = ds.shuffle(seed=cfg.seed)
    ds = ds.repeat(cfg.epochs if cfg.epochs > 0 else None)
    ds = ds.map_with_index(lambda i, r: (int(i), r))
    if process_count > 1:
        ds = ds[process_index::process_count]
    return ds


class PromptPipeline:
    """Iterator over batches (lists) of ``batch_prompts`` :class:`PromptRecord`, checkpointable.

    tokenizer: anything with ``encode(text, add_special_tokens=False) -> list[int]``.
    process_index / process_count default to ``jax.process_index()/process_count()``.
    """

    def __init__(self, cfg: DataConfig, tokenizer, batch_prompts: int, *, process_index: int | None = None,
                 process_count: int | None = None):
        if batch_prompts < 1:
            raise ValueError(f"train.batch_prompts must be >= 1, got {batch_prompts}")
        if process_index is None or process_count is None:
            import jax

            process_index, process_count = jax.process_index(), jax.process_count()
        self.cfg = cfg
        chat, system = cfg.chat_template, (cfg.system or None)

        def tokenize(item):
            slot, rec = item
            ids = encode_prompt(tokenizer, rec["prompt"], chat_template=chat, system=system)
            return PromptRecord(slot=slot, prompt=rec["prompt"], answer=rec["answer"], prompt_ids=ids)

        ds = slot_dataset(cfg, process_index=process_index, process_count=process_count).map(tokenize)
        self._iter = iter(ds.to_iter_dataset().batch(batch_prompts, drop_remainder=True, batch_fn=list))

    def __iter__(self):
        return self

    def __next__(self) -> list[PromptRecord]:
        return next(self._iter)

    def get_state(self) -> dict:
        """JSON-able iterator position."""
        return dict(self._iter.get_state())

    def set_state(self, state: dict) -> None:
        self._iter.set_state(dict(state))
