"""`build_trainer(cfg)`: a `Trainer` wired from its config (compilation cache, model directory
after any SFT warm-up, tokenizer, rewards, prompts, sampler link); parts given are used instead::

    trainer = build_trainer(cfg, sampler=InProcessSampler.from_section(cfg.sampler, model_dir))
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax

from dlc_jax.data.prompts import PromptPipeline
from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.data.tokenize import load_tokenizer
from dlc_jax.errors import UserError, require_dir
from dlc_jax.sampler.client.protocol import Sampler
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.config import TrainConfig
from dlc_jax.trainer.hooks import Hook
from dlc_jax.trainer.loop import Trainer
from dlc_jax.trainer.sampler_link import SamplerLink

logger = logging.getLogger(__name__)


def enable_compile_cache(directory: str, min_compile_s: float = 1.0) -> str | None:
    """Point JAX's compilation cache at ``directory`` ('': off; local: created); where it points."""
    if not directory:
        return None
    if "://" in directory:  # gs://bucket/... : JAX writes it through its own file layer
        where = directory
    else:
        path = Path(directory).expanduser().resolve()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"train.compile_cache_dir: cannot create {path}: {e.strerror}") from e
        where = str(path)
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    logger.info("compilation cache: %s (programs compiling in >= %.1f s)", where, min_compile_s)
    return where


def make_prompts(cfg: TrainConfig, tokenizer: Any, rewards: RewardRunner) -> PromptPipeline:
    """The prompt stream of ``cfg.data``; too long prompts dropped, answers checked at load."""
    s = cfg.sampler
    return PromptPipeline(
        cfg.data,
        tokenizer,
        cfg.train.batch_prompts,
        process_index=0,
        process_count=1,
        max_prompt_tokens=s.max_model_len - s.max_tokens,
        answer_check=rewards.check_answers,
        steps=cfg.train.steps,  # with data.epochs set: refuse at start when the rows cannot last
    )


def build_trainer(
    cfg: TrainConfig,
    *,
    sampler: Sampler | SamplerLink | None = None,
    rewards: RewardRunner | None = None,
    prompts: PromptPipeline | None = None,
    hooks: Iterable[Hook] = (),
) -> Trainer:
    """A `Trainer` for ``cfg`` (module doc); parts given are used as they are."""
    from dlc_jax.trainer.sft import base_model_dir, ensure_env_sft_model, ensure_sft_model

    enable_compile_cache(cfg.train.compile_cache_dir)
    if cfg.model.path:
        require_dir(cfg.model.path, "model.path")
    if cfg.sft.enabled and cfg.env.enabled:  # warm-up on the environment's demonstrations
        model_dir = ensure_env_sft_model(cfg)
    else:
        model_dir = ensure_sft_model(cfg) if cfg.sft.enabled else base_model_dir(cfg)
    tokenizer = load_tokenizer(str(model_dir))
    own_rewards = rewards is None
    rewards = RewardRunner(cfg.reward) if rewards is None else rewards
    try:
        if prompts is None:
            prompts = make_prompts(cfg, tokenizer, rewards)
        if sampler is None:
            sampler = SamplerLink(
                cfg.sampler,
                model_dir=model_dir,
                log_dir=cfg.log.dir,
                multi=dist.process_info().process_count > 1,
            )
        return Trainer(
            cfg,
            sampler=sampler,
            rewards=rewards,
            prompts=prompts,
            model_dir=model_dir,
            tokenizer=tokenizer,
            hooks=hooks,
        )
    except BaseException:
        if own_rewards:
            rewards.close()
        raise
