"""Reference prefixes: held-out prompts with one response each, sampled once from the initial
policy and shared by all runs. Every response position is a prefix: positions ``P-1 .. P+n-2`` of
``tokens [N, L]`` (prompt length P, n response tokens)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dlc_jax.data.arithmetic import ArithmeticConfig, ArithmeticSource
from dlc_jax.data.prompts import DataConfig, load_records
from dlc_jax.data.tokenize import encode_prompt
from dlc_jax.experiments.results import json_safe

# generate(prompt_ids, max_tokens=..., temperature=..., seed=...) -> one int32 response per prompt
GenerateFn = Callable[..., list[np.ndarray]]

NPZ_NAME = "prefixes.npz"
_ARRAYS = ("tokens", "prompt_lens", "response_lens")  # the int32 arrays of a PrefixSet
META_NAME = "prefixes.json"


@dataclasses.dataclass(frozen=True)
class PrefixConfig:
    """How the reference prefix set is made. temperature: use the training one; source:
    "arithmetic" (the synthetic task with ``data_seed``, which must differ from the training seed)
    or a held-out .jsonl/.parquet file (first ``num_prompts`` records); chat_template / system: wrap
    prompts in ChatML like training does."""

    num_prompts: int = 32
    max_tokens: int = 16
    temperature: float = 1.0
    sample_seed: int = 20_250
    source: str = "arithmetic"
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    data_seed: int = 987_654
    chat_template: bool = False
    system: str = ""
    arithmetic: ArithmeticConfig = dataclasses.field(default_factory=ArithmeticConfig)

    def __post_init__(self):
        if self.num_prompts < 1:
            raise ValueError(f"prefixes.num_prompts must be >= 1, got {self.num_prompts}")
        if self.max_tokens < 1:
            raise ValueError(f"prefixes.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"prefixes.temperature must be > 0, got {self.temperature}")


@dataclasses.dataclass
class PrefixSet:
    """tokens: int32 [N, L] prompt + response, right-padded with ``pad_id``; prompt_lens,
    response_lens: int32 [N]; meta: JSON-able description (config, prompts, ...)."""

    tokens: np.ndarray
    prompt_lens: np.ndarray
    response_lens: np.ndarray
    pad_id: int = 0
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        n, length = self.tokens.shape
        if self.prompt_lens.shape != (n,) or self.response_lens.shape != (n,):
            raise ValueError(
                f"prompt_lens {self.prompt_lens.shape} / response_lens {self.response_lens.shape} "
                f"must both be [{n}] for tokens {self.tokens.shape}"
            )
        if np.any(self.prompt_lens < 1):
            raise ValueError("prefix set: every prompt needs at least one token")
        if np.any(self.prompt_lens + self.response_lens > length):
            raise ValueError(f"prefix set: prompt + response longer than tokens width {length}")

    @property
    def attention_mask(self) -> np.ndarray:
        """int32 [N, L]: 1 on real (prompt or response) tokens."""
        pos = np.arange(self.tokens.shape[1])[None, :]
        return (pos < (self.prompt_lens + self.response_lens)[:, None]).astype(np.int32)

    @property
    def prefix_mask(self) -> np.ndarray:
        """float32 [N, L]: 1 where the next-token distribution generated a response token."""
        pos = np.arange(self.tokens.shape[1])[None, :]
        start = (self.prompt_lens - 1)[:, None]
        stop = (self.prompt_lens + self.response_lens - 1)[:, None]
        return ((pos >= start) & (pos < stop)).astype(np.float32)

    @property
    def num_prefixes(self) -> int:
        return int(self.response_lens.sum())

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        arrays = {k: getattr(self, k).astype(np.int32) for k in _ARRAYS}
        np.savez(out / NPZ_NAME, **arrays, pad_id=np.int32(self.pad_id))
        (out / META_NAME).write_text(json.dumps(self.meta, indent=1, sort_keys=True))
        return out

    @classmethod
    def load(cls, out_dir: str | Path) -> PrefixSet:
        out = Path(out_dir)
        path = out / NPZ_NAME
        if not path.exists():
            raise FileNotFoundError(f"no reference prefix set at {path}")
        with np.load(path) as z:
            missing = {*_ARRAYS, "pad_id"} - set(z.files)
            if missing:
                raise ValueError(f"{path}: missing arrays {sorted(missing)}")
            arrays, pad = {k: z[k] for k in _ARRAYS}, int(z["pad_id"])
        meta = json.loads((out / META_NAME).read_text()) if (out / META_NAME).exists() else {}
        return cls(**arrays, pad_id=pad, meta=meta)

    @classmethod
    def exists(cls, out_dir: str | Path) -> bool:
        return (Path(out_dir) / NPZ_NAME).exists()


def heldout_prompts(cfg: PrefixConfig, tokenizer) -> tuple[list[dict], list[np.ndarray]]:
    """The first ``num_prompts`` records of the held-out split and their token ids."""
    src: Sequence[dict] | ArithmeticSource
    if cfg.source == "arithmetic":
        src = ArithmeticSource(cfg.arithmetic, seed=cfg.data_seed)
    else:
        src = load_records(
            DataConfig(
                source=cfg.source, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field
            )
        )
    if cfg.num_prompts > len(src):
        raise ValueError(
            f"prefixes.num_prompts={cfg.num_prompts} > {len(src)} records in {cfg.source!r}"
        )
    recs = [src[i] for i in range(cfg.num_prompts)]
    system = cfg.system or None
    ids = [
        encode_prompt(tokenizer, r["prompt"], chat_template=cfg.chat_template, system=system)
        for r in recs
    ]
    return recs, ids


def assemble(
    prompt_ids: Sequence[np.ndarray],
    responses: Sequence[np.ndarray],
    *,
    pad_id: int = 0,
    meta: dict | None = None,
) -> PrefixSet:
    """Pack prompts and their responses into a right-padded :class:`PrefixSet`."""
    if len(prompt_ids) != len(responses):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(responses)} responses")
    seqs = [
        np.concatenate([np.asarray(p, np.int32), np.asarray(r, np.int32)])
        for p, r in zip(prompt_ids, responses)
    ]
    tokens = np.full((len(seqs), max(map(len, seqs))), pad_id, np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    return PrefixSet(
        tokens=tokens,
        prompt_lens=np.array([len(p) for p in prompt_ids], np.int32),
        response_lens=np.array([len(r) for r in responses], np.int32),
        pad_id=pad_id,
        meta=meta or {},
    )


def create_prefixes(
    cfg: PrefixConfig,
    tokenizer,
    generate: GenerateFn,
    *,
    pad_id: int = 0,
    extra_meta: dict | None = None,
) -> PrefixSet:
    """Sample one response per held-out prompt with ``generate`` and pack them (none empty)."""
    recs, ids = heldout_prompts(cfg, tokenizer)
    responses = generate(
        ids, max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=cfg.sample_seed
    )
    if len(responses) != len(ids):
        raise ValueError(f"generate returned {len(responses)} responses for {len(ids)} prompts")
    for i, r in enumerate(responses):
        if len(r) == 0:
            raise ValueError(
                f"reference prefixes: empty response for held-out prompt {i} "
                f"({recs[i]['prompt']!r})"
            )
        if len(r) > cfg.max_tokens:
            raise ValueError(
                f"reference prefixes: response {i} has {len(r)} tokens > "
                f"max_tokens={cfg.max_tokens}"
            )
    meta = {
        "config": json_safe(dataclasses.asdict(cfg)),
        "prompts": [r["prompt"] for r in recs],
        "answers": [r["answer"] for r in recs],
        **(extra_meta or {}),
    }
    return assemble(ids, responses, pad_id=pad_id, meta=meta)


def load_or_create(
    out_dir: str | Path, cfg: PrefixConfig, tokenizer, generate: GenerateFn, **kw
) -> PrefixSet:
    """Load the prefix set in ``out_dir`` if it exists, else create and save it."""
    if PrefixSet.exists(out_dir):
        return PrefixSet.load(out_dir)
    ps = create_prefixes(cfg, tokenizer, generate, **kw)
    ps.save(out_dir)
    return ps


def client_generate(client) -> GenerateFn:
    """A :data:`GenerateFn` over a ``SamplerClient`` (responses in prompt order, by slot id)."""
    from dlc_jax.sampler.wire.types import SamplingParams

    def generate(prompt_ids, *, max_tokens, temperature, seed):
        params = SamplingParams(
            n=1, max_tokens=int(max_tokens), temperature=float(temperature), seed=int(seed)
        )
        out: dict[int, np.ndarray] = {}
        for r in client.generate([np.asarray(p).tolist() for p in prompt_ids], params):
            out[int(r.slot_id)] = np.asarray(r.response_ids, np.int32)
        missing = [i for i in range(len(prompt_ids)) if i not in out]
        if missing:
            raise RuntimeError(f"sampler returned no response for prompt slots {missing}")
        return [out[i] for i in range(len(prompt_ids))]

    return generate
