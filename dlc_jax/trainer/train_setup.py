"""What the trainer trains, built from its config (`TrainSetup`): the model with any LoRA adapters,
optimizer, schedule, state and the jitted train step and theta_s forward."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from dlc_jax.lora import (
    adapter_parameter_count,
    apply_lora,
    base_fingerprint,
    merged_model,
    trainable_filter,
)
from dlc_jax.trainer.config import TrainConfig
from dlc_jax.trainer.state import TrainState, make_optimizer, make_schedule
from dlc_jax.trainer.step import make_snapshot_logprobs, make_train_step, step_config

logger = logging.getLogger(__name__)

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def load_train_model(cfg: TrainConfig, model_dir, mesh):
    """``model_dir`` loaded with the ``model`` section's dtypes and run options, over ``mesh``."""
    from dlc_jax.model import load_hf

    m = cfg.model
    return load_hf(
        str(model_dir),
        mesh=mesh,
        param_dtype=_DTYPES[m.param_dtype],
        compute_dtype=_DTYPES[m.compute_dtype],
        remat=m.remat_policy_name(),
        scan_layers=m.scan_layers,
        attention_impl=m.attention_impl,
        moe_impl=m.moe_impl,
        moe_dispatch=m.moe_dispatch,
    )


@dataclasses.dataclass
class TrainSetup:
    """serve: what a full push sends (LoRA: merged); base_fp: a LoRA base's fingerprint."""

    state: TrainState
    schedule: Callable[[Any], Any]
    serve: Callable[[Any], Any]
    adapters: bool
    base_fp: Any
    train_step: Callable[..., Any]
    snapshot_lp: Callable[..., Any]


def make_train_setup(cfg: TrainConfig, model_dir: str | Path, mesh) -> TrainSetup:
    """Load the model, add any LoRA adapters (then the only trainable part), build the rest."""
    model = load_train_model(cfg, model_dir, mesh)
    adapted = apply_lora(model, cfg.lora)
    tx = make_optimizer(cfg.optim, cfg.train.steps)
    schedule = make_schedule(cfg.optim, cfg.train.steps)
    state = TrainState.create(
        model,
        tx,
        max_snapshots=cfg.resync.max_snapshots,
        mesh=mesh,
        trainable=trainable_filter(cfg.lora),
    )
    serve: Callable[[Any], Any] = merged_model if adapted else (lambda m: m)
    base_fp = base_fingerprint(state.params) if adapted else None
    if adapted:
        logger.info(
            "lora: rank %d adapters on %d projections (%s parameters trained)",
            cfg.lora.rank,
            len(adapted),
            f"{adapter_parameter_count(model):,}",
        )
    step_cfg = step_config(cfg)
    shard: dict[str, Any] = {}
    if mesh is not None:
        shard = dict(
            mesh=mesh,
            param_shardings=jax.tree.map(lambda x: x.sharding, state.params),
            opt_shardings=jax.tree.map(lambda x: x.sharding, state.opt_state),
        )
    train_step = make_train_step(state.graphdef, tx, step_cfg, trainable=state.trainable, **shard)
    snapshot_lp = make_snapshot_logprobs(state.graphdef, step_cfg)
    return TrainSetup(state, schedule, serve, bool(adapted), base_fp, train_step, snapshot_lp)
