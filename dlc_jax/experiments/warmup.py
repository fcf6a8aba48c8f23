"""Supervised warm-up of the tiny Qwen3 on the chain-arithmetic task (worked answers), cached.

The trainer's own warm-up (``dlc_jax.trainer.sft``) teaches the 1-digit ``arithmetic`` answer; the
chain task needs the worked answer (``3+5=8,8+2=10 #### 10``) as the target while the reward
compares only the final number. This module reuses the trainer's SFT pieces (``sft_examples``,
``sft_train``, ``greedy_accuracy``) with that target, and writes the HF directory every experiment
run starts from, plus the task's JSONL (the ``data.source`` file of the runs). Both are keyed by a
hash of the settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np

from dlc_jax.data.chain_arith import ChainArithConfig, ChainArithSource, WorkedTargets, write_jsonl

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ChainWarmup:
    """task: the chain task; data_seed: its training split seed; steps / batch_size / lr: SFT length
    (few steps on purpose: a middling accuracy leaves RL room to improve); model_seed: the tiny
    model's init; eval_prompts: held-out prompts for the (near-)greedy accuracy recorded in
    ``warmup.json``; model_dims: ``make_tiny`` keyword overrides (a larger Qwen3 body for
    accelerator presets)."""

    task: ChainArithConfig = dataclasses.field(default_factory=ChainArithConfig)
    data_seed: int = 0
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    model_seed: int = 0
    max_tokens: int = 48
    eval_prompts: int = 32
    eval_seed: int = 987_654
    model_dims: tuple[
        tuple[str, int], ...
    ] = ()  # make_tiny size overrides, e.g. (("hidden_size", 1024),)

    def key(self) -> str:
        d = dataclasses.asdict(self)
        if not d["model_dims"]:
            del d["model_dims"]  # keys made before the field existed stay valid
        blob = json.dumps(d, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def data_file(cfg: ChainWarmup, cache_dir: str | Path) -> Path:
    """The training split as JSONL (written once)."""
    p = Path(cache_dir) / f"chain_arith-{cfg.key()}.jsonl"
    if not p.exists():
        write_jsonl(ChainArithSource(cfg.task, seed=cfg.data_seed), p)
    return p


def ensure_chain_model(cfg: ChainWarmup, cache_dir: str | Path) -> Path:
    """HF dir of the tiny model warmed up on worked chain answers (trained once, then reused)."""
    import jax.numpy as jnp

    from dlc_jax.data.tokenize import encode_prompt, load_tokenizer
    from dlc_jax.model import load_hf
    from dlc_jax.model.tiny import make_tiny
    from dlc_jax.trainer.sft import save_warm, sft_examples, sft_train

    cache_dir = Path(cache_dir)
    out = cache_dir / f"chain-warmup-{cfg.key()}"
    if (out / "warmup.json").exists():
        return out
    dims = "".join(f"-{k}{v}" for k, v in cfg.model_dims)
    base = cache_dir / f"tiny-seed{cfg.model_seed}{dims}"
    if not (base / "DONE").exists():
        shutil.rmtree(base, ignore_errors=True)
        make_tiny(base, seed=cfg.model_seed, **dict(cfg.model_dims))  # type: ignore[arg-type]
        (base / "DONE").write_text("ok")
    tok = load_tokenizer(str(base))
    eos = tok.eos_token_id
    if eos is None:
        raise ValueError(f"model {base}: tokenizer has no eos token")
    train = WorkedTargets(ChainArithSource(cfg.task, seed=cfg.data_seed))
    longest = max(
        len(encode_prompt(tok, train[i]["prompt"])) + len(tok.encode(train[i]["answer"]))
        for i in range(min(len(train), 256))
    )
    seq_len = longest + 8
    rng = np.random.default_rng(cfg.model_seed + 1)

    def batches():
        while True:
            idx = rng.integers(0, len(train), cfg.batch_size)
            b = sft_examples(train, tok, eos, idx, seq_len=seq_len, chat_template=False)
            yield {k: jnp.asarray(v) for k, v in b.items()}

    model = load_hf(str(base))
    t0 = time.time()
    losses = sft_train(model, batches(), lr=cfg.lr, steps=cfg.steps, log=log.info)
    acc = greedy_accuracy(
        model,
        ChainArithSource(cfg.task, seed=cfg.eval_seed),
        tok,
        eos,
        n=min(cfg.task.num_examples, cfg.eval_prompts),
        max_tokens=cfg.max_tokens,
    )
    info = save_warm(
        model,
        base,
        out,
        "warmup.json",
        lambda: {
            "config": dataclasses.asdict(cfg),
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "greedy_accuracy": acc,
            "seconds": time.time() - t0,
            "seq_len": seq_len,
        },
    )
    log.info(
        "chain warm-up: %d steps in %.0fs, loss %.3f -> %.3f, greedy accuracy %.2f",
        cfg.steps,
        info["seconds"],
        losses[0],
        losses[-1],
        acc,
    )
    return out


def greedy_accuracy(
    model, source: ChainArithSource, tok, eos_id: int, *, n: int, max_tokens: int
) -> float:
    """Fraction of the first ``n`` prompts whose near-greedy (temperature 1e-4) answer scores 1 (one
    jitted shape for all prompts, see own_prefixes.sample_responses)."""
    from dlc_jax.data.tokenize import encode_prompt
    from dlc_jax.experiments.heldout import GREEDY_TEMPERATURE, sampled_answers, score_answers

    if n < 1:
        return float("nan")
    recs = [source[i] for i in range(n)]
    prompts = [encode_prompt(tok, r["prompt"]) for r in recs]
    kw = dict(max_tokens=max_tokens, temperature=GREEDY_TEMPERATURE, seed=0)
    texts = sampled_answers(model, prompts, tok.decode, eos_id=eos_id, **kw)
    return float(np.mean(score_answers(texts, [r["answer"] for r in recs])))
