"""`build_trainer(cfg)`: the wiring of a training run from its config, the parts `Trainer` takes:
the compilation cache, the model directory (the SFT warm-up first when ``sft.enabled``), its
tokenizer, the reward workers, the training prompts and the sampler link. A part given as an
argument is used instead of the one the config would make::

    trainer = build_trainer(cfg, sampler=InProcessSampler.from_section(cfg.sampler, model_dir))
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dlc_jax.data.prompts import PromptPipeline
from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.data.tokenize import load_tokenizer
from dlc_jax.errors import require_dir
from dlc_jax.sampler.client.protocol import Sampler
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.compile_cache import enable_compile_cache
from dlc_jax.trainer.config import TrainConfig
from dlc_jax.trainer.hooks import Hook
from dlc_jax.trainer.loop import Trainer
from dlc_jax.trainer.sampler_link import SamplerLink


def make_prompts(cfg: TrainConfig, tokenizer: Any, rewards: RewardRunner) -> PromptPipeline:
    """The training prompt stream of ``cfg.data`` (every process builds the same one and keeps its
    slots), prompts longer than the sampler's room dropped at load, gold answers checked by the
    rewards."""
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
    """A `Trainer` for ``cfg`` with today's wiring (see the module doc); parts given are used as
    they are."""
    from dlc_jax.trainer.sft import base_model_dir, ensure_env_sft_model, ensure_sft_model

    enable_compile_cache(cfg.train.compile_cache_dir)
    if cfg.model.path:
        require_dir(cfg.model.path, "model.path")
    if cfg.sft.enabled and cfg.env.enabled:  # warm-up on the environment's demonstrations
        model_dir = ensure_env_sft_model(cfg)
    else:
        model_dir = ensure_sft_model(cfg) if cfg.sft.enabled else base_model_dir(cfg)
    tokenizer = load_tokenizer(str(model_dir))
    # rewards run in worker processes; the data is checked against them at load
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
