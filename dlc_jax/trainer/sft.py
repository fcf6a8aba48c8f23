"""Supervised warm-up of the tiny Qwen3 (a random one never earns a reward): cross-entropy on the
answer tokens of the arithmetic task, or on ``env.fn``'s demonstrations; cached by config hash.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dlc_jax.data.arithmetic import ArithmeticSource
from dlc_jax.data.tokenize import encode_prompt, load_tokenizer

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def sft_examples(
    source: ArithmeticSource,
    tokenizer,
    eos_id: int,
    indices,
    *,
    seq_len: int,
    chat_template: bool,
    system: str | None = None,
) -> dict[str, np.ndarray]:
    """int32 ``input_ids``/``targets``, float32 ``mask`` (answer and eos) [N, seq_len]."""
    n = len(indices)
    ids = np.full((n, seq_len), eos_id, np.int32)
    tgt = np.full((n, seq_len), eos_id, np.int32)
    mask = np.zeros((n, seq_len), np.float32)
    for row, i in enumerate(indices):
        ex = source[int(i)]
        p = encode_prompt(tokenizer, ex["prompt"], chat_template=chat_template, system=system)
        a = np.asarray(tokenizer.encode(ex["answer"], add_special_tokens=False), np.int32)
        seq = np.concatenate([p, a, [eos_id]]).astype(np.int32)
        if len(seq) > seq_len:
            raise ValueError(f"SFT example {ex} is {len(seq)} tokens > seq_len {seq_len}")
        ids[row, : len(seq)] = seq
        tgt[row, : len(seq) - 1] = seq[1:]
        mask[row, len(p) - 1 : len(seq) - 1] = 1.0
    return {"input_ids": ids, "targets": tgt, "mask": mask}


def sft_loss(model, batch) -> jax.Array:
    """Mean next-token cross-entropy over ``batch['mask']`` tokens (scalar)."""
    logits = model(batch["input_ids"]).astype(jnp.float32)
    lp = jax.nn.log_softmax(logits, axis=-1)
    tok = jnp.take_along_axis(lp, batch["targets"][..., None], axis=-1)[..., 0]
    return -(tok * batch["mask"]).sum() / jnp.maximum(batch["mask"].sum(), 1.0)


def sft_train(
    model,
    batches,
    *,
    lr: float,
    steps: int,
    log_every: int = 50,
    log: Callable[[str], None] | None = None,
) -> list[float]:
    """Train ``model`` in place on the ``batches`` iterator; returns the losses."""
    log = log or logger.info
    from flax import nnx

    warmup, total = max(1, steps // 10), max(steps, 2)
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total, lr * 0.1)
    opt = nnx.Optimizer(model, optax.adamw(sched), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, batch):
        loss, grads = nnx.value_and_grad(sft_loss)(model, batch)
        opt.update(model, grads)
        return loss

    losses = []
    for s in range(steps):
        losses.append(float(step(model, opt, next(batches))))
        if s % log_every == 0 or s == steps - 1:
            log(f"sft step {s}/{steps} loss {losses[-1]:.4f}")
    return losses


def greedy_accuracy(
    model,
    source: ArithmeticSource,
    tokenizer,
    eos_id: int,
    indices,
    *,
    max_tokens: int,
    chat_template: bool,
) -> float:
    """Fraction of ``indices`` answered exactly by greedy decoding (a full forward per token)."""
    from dlc_jax.data.rewards import exact_match_reward

    correct = 0
    fwd = jax.jit(lambda ids: model(ids))
    for i in indices:
        ex = source[int(i)]
        ids = list(encode_prompt(tokenizer, ex["prompt"], chat_template=chat_template))
        out = []
        for _ in range(max_tokens):
            nxt = int(jnp.argmax(fwd(jnp.asarray([ids], jnp.int32))[0, -1]))
            if nxt == eos_id:
                break
            out.append(nxt)
            ids.append(nxt)
        correct += exact_match_reward(tokenizer.decode(out), ex["answer"]) > 0
    return correct / max(1, len(indices))


def sft_cache_dir(cfg) -> Path:
    """Where the warmed model of ``cfg`` lives, keyed by the model/data/sft sections less the run
    options the warm-up does not use (``model.remat`` keyed it before they existed)."""
    drop = ("model.attention_impl", "model.scan_layers", "model.remat_policy")
    return Path(cfg.sft.cache_dir) / f"sft-{cfg.hash('model', 'data', 'sft', drop=drop)}"


def tiny_model_dir(cfg) -> Path:
    """Where `base_model_dir` makes the tiny model of ``cfg`` (``model.path`` empty)."""
    return Path(cfg.sft.cache_dir) / f"tiny-{cfg.model.preset}-seed{cfg.train.seed}"


def base_model_dir(cfg) -> Path:
    """The untrained model directory: ``model.path`` or a tiny Qwen3 made once under the cache."""
    if cfg.model.path:
        return Path(cfg.model.path)
    from dlc_jax.model.tiny import make_tiny

    d = tiny_model_dir(cfg)
    if not (d / "DONE").exists():
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        make_tiny(tmp, seed=cfg.train.seed)
        (tmp / "DONE").write_text("ok")
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return d


def ensure_sft_model(cfg, *, log: Callable[[str], None] | None = None) -> Path:
    """HF dir of the SFT-warmed model for ``cfg``, trained unless cached."""
    log = log or logger.info
    out = sft_cache_dir(cfg)
    if (out / "sft.json").exists():
        log(f"sft: reusing cached warm-up {out}")
        return out
    if cfg.data.source != "arithmetic":
        raise ValueError("sft.enabled: the warm-up only supports data.source=arithmetic")
    from dlc_jax.model import load_hf

    base = base_model_dir(cfg)
    tok = load_tokenizer(str(base))
    eos = tok.eos_token_id
    if eos is None:
        raise ValueError(f"model {base}: tokenizer has no eos token")
    source = ArithmeticSource(cfg.data.arithmetic, seed=cfg.data.seed)
    model = load_hf(str(base))
    rng = np.random.default_rng(cfg.train.seed + 1)
    prompts = (source[i]["prompt"] for i in range(min(len(source), 256)))
    chat = cfg.data.chat_template
    longest = max(len(encode_prompt(tok, p, chat_template=chat)) for p in prompts)
    seq_len = 8 + cfg.sampler.max_tokens + longest

    def batches():
        while True:
            idx = rng.integers(0, len(source), cfg.sft.batch_size)
            arr = sft_examples(source, tok, eos, idx, seq_len=seq_len, chat_template=chat)
            yield {k: jnp.asarray(v) for k, v in arr.items()}

    t0 = time.time()
    losses = sft_train(model, batches(), lr=cfg.sft.lr, steps=cfg.sft.steps, log=log)
    n, max_tokens = min(len(source), 32), cfg.sampler.max_tokens
    acc = greedy_accuracy(
        model, source, tok, eos, range(n), max_tokens=max_tokens, chat_template=chat
    )
    info = _save_warm(
        model, base, out, losses, t0, {"steps": cfg.sft.steps, "greedy_accuracy": acc}
    )
    log(
        f"sft: trained {cfg.sft.steps} steps in {info['seconds']:.0f}s, loss "
        f"{info['loss_first']:.3f} -> {info['loss_last']:.3f}, greedy accuracy {acc:.2f}; "
        f"saved {out}"
    )
    return out


def _save_warm(model, base: Path, out: Path, losses: list[float], t0: float, extra: dict) -> dict:
    """`save_warm` with an ``sft.json`` record (base, ``extra``, losses, seconds since ``t0``)."""
    return save_warm(
        model,
        base,
        out,
        "sft.json",
        lambda: {
            "base": str(base),
            **extra,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "seconds": time.time() - t0,
        },
    )


def save_warm(model, base: Path, out: Path, record: str, info: Callable[[], dict]) -> dict:
    """Write ``model``, ``base``'s tokenizer files and ``info()`` (JSON ``record``) to ``out``."""
    from dlc_jax.model import save_hf

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_hf(model, tmp)
    for f in _TOKENIZER_FILES:
        if (base / f).exists() and not (tmp / f).exists():
            shutil.copy(base / f, tmp / f)
    rec = info()
    (tmp / record).write_text(json.dumps(rec, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return rec


def _env_rows(cfg) -> list[dict]:
    """The data rows (at most 4096) the environment's demonstrations are played on."""
    from dlc_jax.data.answers import extract_gold
    from dlc_jax.data.sources import open_source

    d = cfg.data
    src = open_source(
        d.source, split=d.split, subset=d.subset, arithmetic=d.arithmetic, seed=d.seed
    )
    rows = (src.row(i) for i in range(min(len(src), 4096)))
    return [
        {
            **raw,
            "prompt": str(raw[d.prompt_field]),
            "answer": extract_gold(str(raw[d.answer_field]), d.answer_format),
        }
        for raw in rows
    ]


def ensure_env_sft_model(cfg, *, log: Callable[[str], None] | None = None) -> Path:
    """HF dir of the tiny model warmed on ``env.fn``'s demonstrations, cached."""
    from dlc_jax.env.demos import demo_batch, demonstrations
    from dlc_jax.model import load_hf

    log = log or logger.info
    out = Path(cfg.sft.cache_dir) / f"env-sft-{cfg.hash('model', 'data', 'sft', 'env')}"
    if (out / "sft.json").exists():
        log(f"sft: reusing cached environment warm-up {out}")
        return out
    base = base_model_dir(cfg)
    tok = load_tokenizer(str(base))
    hists, counts = demonstrations(
        cfg.env, tok, _env_rows(cfg), enable_thinking=cfg.data.enable_thinking
    )
    seq_len = max(len(h) for h in hists)
    model = load_hf(str(base))
    rng = np.random.default_rng(cfg.train.seed + 1)

    def batches():
        while True:
            idx = rng.integers(0, len(hists), cfg.sft.batch_size)
            arr = demo_batch([hists[i] for i in idx], seq_len, int(tok.eos_token_id))
            yield {k: jnp.asarray(v) for k, v in arr.items()}

    t0 = time.time()
    losses = sft_train(model, batches(), lr=cfg.sft.lr, steps=cfg.sft.steps, log=log)
    extra = {"env": cfg.env.fn, "demonstrations": len(hists), "steps": cfg.sft.steps, **counts}
    _save_warm(model, base, out, losses, t0, extra)
    log(f"sft: {cfg.sft.steps} steps on {len(hists)} demonstrations of {cfg.env.fn}; saved {out}")
    return out
