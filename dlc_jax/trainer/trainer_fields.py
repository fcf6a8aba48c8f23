"""The attributes `Trainer` sets in its constructor, declared once for the mixins that work on them
(`batch_requests.BatchRequests`, `run_lifecycle.RunLifecycle`) so each is type-checked alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlc_jax.data.prompts import PromptPipeline
from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.batching import BatchAssembler
from dlc_jax.trainer.checkpoint import Checkpointer
from dlc_jax.trainer.config import TrainConfig
from dlc_jax.trainer.resync import ResyncPolicy
from dlc_jax.trainer.rollouts import RolloutFeeder
from dlc_jax.trainer.sampler_link import SamplerLink
from dlc_jax.trainer.state import TrainState


class TrainerFields:
    """Declarations only (``Trainer.__init__`` assigns them)."""

    cfg: TrainConfig
    proc: dist.ProcessInfo
    multi: bool
    model_dir: Path
    eos_id: int
    rows: Any
    state: TrainState
    policy: ResyncPolicy
    rewards: RewardRunner
    data: PromptPipeline
    assembler: BatchAssembler
    link: SamplerLink
    feeder: RolloutFeeder
    ckpt: Checkpointer
    resumed: bool
    counters: dict[str, int]
    # index -> {"prompts": {slot: PromptRecord}, "data_state", "local_slots", "alone", "dropped"}
    batches: dict[int, dict]
    _recover_sampler: Callable[[BaseException], None]
    serve: Callable[[Any], Any]  # the module the sampler gets for a trained one (LoRA: merged)
    base_fingerprint: str | None  # LoRA: the frozen base's (checkpoints hold adapters only)
