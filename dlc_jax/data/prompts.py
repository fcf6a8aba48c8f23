"""Grain prompt pipeline: examples loaded and checked once (`validate`), then shuffle(seed) ->
repeat(epochs) -> global slot id (``epoch * N + position``) -> shard by JAX process -> tokenize ->
batches of ``batch_prompts``, checkpointable by a small JSON-able state."""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Literal

import grain
import numpy as np

from dlc_jax.data.arithmetic import ArithmeticConfig, ArithmeticSource
from dlc_jax.data.sources import DataError, open_source
from dlc_jax.data.tokenize import count_prompt_tokens, encode_prompt_counted
from dlc_jax.data.validate import AnswerCheck, Example, LoadStats, load_examples


class DataExhausted(DataError, StopIteration):
    """The prompts ran out (``data.epochs`` set): a ``for`` loop ends cleanly, a ``next()`` caller
    not expecting the end (the trainer) gets a one-line DataError saying how many steps it gives."""


@dataclasses.dataclass
class DataConfig:
    """Config section ``data`` (keys: docs/CONTRACTS.md). ``answer_format``: 'raw', 'gsm8k' (after
    the last '####') or 'boxed'; ``epochs`` (0 = forever) allows ``epochs * usable prompts //
    batch_prompts`` steps; ``timeout_s``: deadline of loading an HF data set; ``chat_template``:
    render with the tokenizer's template (ChatML when it has none)."""

    source: str = "arithmetic"
    split: str = "train"
    subset: str = ""
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    answer_format: Literal["raw", "gsm8k", "boxed"] = "raw"
    seed: int = 0
    shuffle: bool = True
    epochs: int = 0
    chat_template: bool = False
    system: str = ""
    enable_thinking: bool = True
    timeout_s: float = 300.0
    arithmetic: ArithmeticConfig = dataclasses.field(default_factory=ArithmeticConfig)

    def __post_init__(self):
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 0:
            raise ValueError(f"DataConfig.epochs: must be an integer >= 0, got {self.epochs!r}")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s < math.inf):
            raise ValueError(
                f"DataConfig.timeout_s: must be finite and > 0, got {self.timeout_s!r}"
            )


@dataclasses.dataclass
class PromptRecord:
    """One prompt with its stable global slot id. ``prompt_ids`` is int32 [P]; ``row`` is the
    source row; ``metadata`` the row's other scalar columns (passed to reward functions)."""

    slot: int
    prompt: str
    answer: str
    prompt_ids: np.ndarray
    row: int = -1
    metadata: dict = dataclasses.field(default_factory=dict)


def load_data(cfg: DataConfig, **checks: Any) -> tuple[list[Example], LoadStats]:
    """Validated examples of ``cfg.source``; ``checks``: `validate.load_examples`' keywords."""
    src = open_source(
        cfg.source, split=cfg.split, subset=cfg.subset, arithmetic=cfg.arithmetic, seed=cfg.seed,
        timeout_s=cfg.timeout_s,
    )  # fmt: skip
    synthetic = cfg.source == "arithmetic"  # its own field names and raw answers
    return load_examples(
        src,
        prompt_field="prompt" if synthetic else cfg.prompt_field,
        answer_field="answer" if synthetic else cfg.answer_field,
        answer_format="raw" if synthetic else cfg.answer_format,
        **checks,
    )


def load_records(cfg: DataConfig) -> list[dict] | ArithmeticSource:
    """Random-access records ``{"prompt", "answer"}`` (fields checked, gold answers extracted)."""
    if cfg.source == "arithmetic":
        return ArithmeticSource(cfg.arithmetic, seed=cfg.seed)
    examples, _ = load_data(cfg)
    return [{"prompt": e.prompt, "answer": e.answer} for e in examples]


def slot_dataset(
    examples, cfg: DataConfig, *, process_index: int = 0, process_count: int = 1
) -> grain.MapDataset:
    """MapDataset of ``(slot, example)`` for this process, before tokenization."""
    ds = grain.MapDataset.source(examples)
    if cfg.shuffle:
        ds = ds.shuffle(seed=cfg.seed)
    ds = ds.repeat(cfg.epochs if cfg.epochs > 0 else None)
    ds = ds.map_with_index(lambda i, r: (int(i), r))
    if process_count > 1:
        ds = ds[process_index::process_count]
    return ds


class PromptPipeline:
    """Iterator over batches (lists) of ``batch_prompts`` :class:`PromptRecord`, checkpointable.
    ``max_prompt_tokens``: longer prompts dropped at load; ``steps``: refused at start when
    ``data.epochs`` gives fewer batches; process index / count default to JAX's."""

    def __init__(
        self,
        cfg: DataConfig,
        tokenizer,
        batch_prompts: int,
        *,
        process_index: int | None = None,
        process_count: int | None = None,
        max_prompt_tokens: int | None = None,
        answer_check: AnswerCheck | None = None,
        steps: int | None = None,
    ):
        if batch_prompts < 1:
            raise ValueError(f"train.batch_prompts must be >= 1, got {batch_prompts}")
        if process_index is None or process_count is None:
            import jax

            process_index, process_count = jax.process_index(), jax.process_count()
        self.cfg = cfg
        render: dict[str, Any] = dict(chat_template=cfg.chat_template, system=cfg.system or None)
        render["enable_thinking"] = cfg.enable_thinking
        examples, self.stats = load_data(
            cfg,
            answer_check=answer_check,
            max_prompt_tokens=max_prompt_tokens,
            count_tokens=lambda prompts: count_prompt_tokens(tokenizer, prompts, **render),
        )
        if len(examples) < batch_prompts * process_count and cfg.epochs == 1:
            raise DataError(
                f"data.source: {len(examples)} usable prompts, fewer than one batch of "
                f"{batch_prompts * process_count}"
            )
        self._n_examples, self._batch_prompts = len(examples), batch_prompts
        # with epochs set: the full batches of this process (grain drops the last partial one)
        self.total_batches: int | None = None
        if cfg.epochs > 0:
            mine = len(range(process_index, len(examples) * cfg.epochs, process_count))
            self.total_batches = mine // batch_prompts
        if steps is not None and self.total_batches is not None and self.total_batches < steps:
            raise DataError(f"train.steps={steps}: {self._ran_out()}")

        self.escaped_special_tokens = 0  # control tokens of prompts kept as text (data/...)
        lock = threading.Lock()

        def tokenize(item):
            slot, ex = item
            ids, escaped = encode_prompt_counted(tokenizer, ex.prompt, **render)
            if escaped:
                with lock:
                    self.escaped_special_tokens += escaped
            return PromptRecord(slot, ex.prompt, ex.answer, ids, ex.row, ex.metadata)

        ds = slot_dataset(
            examples, cfg, process_index=process_index, process_count=process_count
        ).map(tokenize)
        self._iter = iter(
            ds.to_iter_dataset().batch(batch_prompts, drop_remainder=True, batch_fn=list)
        )

    def __iter__(self):
        return self

    def __next__(self) -> list[PromptRecord]:
        try:
            return next(self._iter)
        except StopIteration:
            raise DataExhausted(f"the data ran out: {self._ran_out()}") from None

    def _ran_out(self) -> str:
        return (
            f"data.epochs={self.cfg.epochs} over {self._n_examples} usable prompts gives "
            f"{self.total_batches} batches of train.batch_prompts={self._batch_prompts}; lower "
            f"train.steps to {self.total_batches} or raise data.epochs (0 = forever)"
        )

    def get_state(self) -> dict:
        """JSON-able iterator position."""
        return dict(self._iter.get_state())

    def set_state(self, state: dict) -> None:
        self._iter.set_state(dict(state))
