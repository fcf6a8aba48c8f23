"""Supervised warm-up of the tiny Qwen3 on worked chain-arithmetic answers (``3+5=8,8+2=10 ####
10``; the reward compares only the final number) with the trainer's SFT pieces: the HF directory
every run starts from and the task's JSONL, cached by a settings hash."""

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
from dlc_jax.data.tokenize import encode_prompt, load_tokenizer
from dlc_jax.experiments.heldout import GREEDY_TEMPERATURE, sampled_answers, score_answers

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ChainWarmup:
    """data_seed: the training split's seed; steps: few on purpose (a middling accuracy leaves RL
    room to improve); eval_prompts: held-out prompts of the greedy accuracy in ``warmup.json``;
    model_dims: ``make_tiny`` size overrides, e.g. (("hidden_size", 1024),)."""

    task: ChainArithConfig = dataclasses.field(default_factory=ChainArithConfig)
    data_seed: int = 0
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    model_seed: int = 0
    max_tokens: int = 48
    eval_prompts: int = 32
    eval_seed: int = 987_654
    model_dims: tuple[tuple[str, int], ...] = ()

    def key(self) -> str:
        d = dataclasses.asdict(self)
        if not d["model_dims"]:
            del d["model_dims"]  # keys made before the field existed stay valid
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def data_file(cfg: ChainWarmup, cache_dir: str | Path) -> Path:
    """The training split as JSONL (written once)."""
    p = Path(cache_dir) / f"chain_arith-{cfg.key()}.jsonl"
    if not p.exists():
        write_jsonl(ChainArithSource(cfg.task, seed=cfg.data_seed), p)
    return p


def ensure_chain_model(cfg: ChainWarmup, cache_dir: str | Path) -> Path:
    """HF dir of the tiny model warmed up on worked chain answers (trained once, then reused)."""
    import jax.numpy as jnp

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
    seq_len = 8 + max(  # the longest of the first 256 examples, and some room
        len(encode_prompt(tok, train[i]["prompt"])) + len(tok.encode(train[i]["answer"]))
        for i in range(min(len(train), 256))
    )
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
        f"chain warm-up: {cfg.steps} steps in {info['seconds']:.0f}s, loss {losses[0]:.3f} -> "
        f"{losses[-1]:.3f}, greedy accuracy {acc:.2f}"
    )
    return out


def greedy_accuracy(
    model, source: ChainArithSource, tok, eos_id: int, *, n: int, max_tokens: int
) -> float:
    """Fraction of the first ``n`` prompts whose near-greedy answer scores 1."""
    if n < 1:
        return float("nan")
    recs = [source[i] for i in range(n)]
    prompts = [encode_prompt(tok, r["prompt"]) for r in recs]
    kw = dict(max_tokens=max_tokens, temperature=GREEDY_TEMPERATURE, seed=0)
    texts = sampled_answers(model, prompts, tok.decode, eos_id=eos_id, **kw)
    return float(np.mean(score_answers(texts, [r["answer"] for r in recs])))
