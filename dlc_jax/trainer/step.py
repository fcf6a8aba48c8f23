"""The jitted training step: forward at theta_t, the loss, gradient accumulation over
micro-batches (``jax.lax.scan``), the AdamW update and the step metrics. theta_s log-probs come
from the snapshot forward (`make_snapshot_logprobs`) per version; tokens of the current weights
(``self_mask``) use ``stop_gradient(lp)``, so on-policy no snapshot forward runs at all.

Batch arrays (`batching.step_arrays`): input_ids/targets/positions/attention_mask/segment_ids [B,L]
int32; mask/lp_q/lp_s [B,L] f32; self_mask [B,L] bool; head_ids [B,L,K] int32; lq_head/lps_head
[B,L,K] f32; adv [B] f32, or [B,L] on packed rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dlc_jax.rl import (
    LossInputs,
    compute_loss,
    resync_decision,
    step_metrics,
    truncates,
    vocab_parallel_token_logprobs,
    vocab_shards,
)
from dlc_jax.trainer.state import apply_updates, join_trainable, split_trainable

STEP_KEYS = (
    "input_ids",
    "targets",
    "positions",
    "attention_mask",
    "mask",
    "lp_q",
    "lp_s",
    "self_mask",
    "head_ids",
    "lq_head",
    "lps_head",
    "adv",
    "segment_ids",
    "routed_experts",
)
# may be absent: segment_ids (then one sequence per row), routed_experts (router_replay=sampler)
OPTIONAL_STEP_KEYS = ("segment_ids", "routed_experts")
# losses that reduce over a row's tokens as one sequence: wrong on packed rows (several sequences)
SEQUENCE_LOSSES = ("tis_seq", "mis_seq", "mis_geo", "vcpo")


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static settings of the step. ``loss`` is a ``dlc_jax.rl.LossConfig``; temperature/top_k/top_p
    are the sampler's, so the trainer normalizes on the same support; head_k = 0 means no head."""

    loss: Any
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    head_k: int = 0
    micro_batches: int = 1
    # log-prob positions per device per chunk (each device's f32 logits block: chunk_size x V)
    chunk_size: int = 256
    resync_threshold: float = 0.5
    resync_statistic: str = "token"  # resync.statistic: the lag ESS of resync_wanted
    old_policy: str = "current"  # lp_old: 'current' (sg(lp)) | 'sampler' (lp_q) | 'snapshot' (lp_s)
    load_balance_loss: float = 0.0  # moe.load_balance_loss (mixture-of-experts models)
    lora_dropout: float = 0.0  # lora.dropout: adapter-input dropout, training forward only
    lora_seed: int = 0  # lora.seed: the dropout masks' key (with the update count)


def step_config(cfg) -> StepConfig:
    """The StepConfig of a ``dlc_jax.trainer.config.TrainConfig`` (what the trainer compiles)."""
    from dlc_jax.trainer.config import make_loss_config
    from dlc_jax.trainer.config_sections import ConfigError

    s = cfg.sampler
    if cfg.train.pack and cfg.loss.name in SEQUENCE_LOSSES:  # a user error: one line, exit 2
        raise ConfigError(
            f"train.pack: loss.name={cfg.loss.name!r} reduces over each row as one sequence, but a "
            f"packed row holds several; use a token-level loss or train.pack=false"
        )
    return StepConfig(
        loss=make_loss_config(cfg.loss),
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        head_k=s.head_k,
        micro_batches=cfg.train.micro_batches,
        resync_threshold=cfg.resync.threshold,
        resync_statistic=cfg.resync.statistic,
        old_policy=cfg.loss.old_policy,
        load_balance_loss=cfg.moe.load_balance_loss,
        lora_dropout=cfg.lora.dropout if cfg.lora.enabled else 0.0,
        lora_seed=cfg.lora.seed,
    )


def policy_logprobs(
    graphdef, params, batch: dict, cfg: StepConfig, with_routing: bool = False, dropout_key=None
):
    """TokenLogprobs of ``batch['targets']`` (and the head) under ``params``, sampler transform.
    An MoE model replays ``batch['routed_experts']`` when present; ``with_routing`` returns
    ``(TokenLogprobs, (Routing, sparse layers) | None)``. ``dropout_key``: LoRA adapter dropout."""
    from flax import nnx

    from dlc_jax.model.registry import family_of
    from dlc_jax.model.sharding import logprob_vocab_axes

    model = nnx.merge(graphdef, params)
    if dropout_key is not None:
        from dlc_jax.lora.dropout import enable_dropout

        enable_dropout(model, dropout_key, cfg.lora_dropout)
    moe = {}
    routes = family_of(model.config).routed_experts  # a dense model has no routing
    if routes and ("routed_experts" in batch or with_routing):
        moe = dict(routed_experts=batch.get("routed_experts"), return_routing=True)
    out = model.hidden_states(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        positions=batch["positions"],
        segment_ids=batch.get("segment_ids"),
        **moe,
    )
    h, routing = out if moe else (out, None)
    # the vocabulary split over the devices the positions are split over (rl.vocab_parallel)
    rows, positions = model.act_sharding.logprob_axes(h.shape[0], h.shape[1])
    mesh, w = model.act_sharding.mesh, model.unembedding()
    vaxes = None if mesh is None else logprob_vocab_axes(mesh, rows, positions)  # ICI only
    n = vocab_shards(mesh, rows, positions, vaxes)
    n = 1 if truncates(w.shape[0], cfg.top_k, cfg.top_p) or not vaxes else n
    tl = vocab_parallel_token_logprobs(
        h,
        w,
        batch["targets"],
        mesh=mesh,
        rows=rows,
        positions=positions,
        vocab_axes=vaxes,
        head_ids=batch["head_ids"] if cfg.head_k else None,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        chunk_size=cfg.chunk_size * n,  # chunk_size of each of the n devices' positions
    )

    # back to the batch layout the next program's in_shardings expect (jit does not reshard it)
    def batch_layout(x):
        return model.act_sharding.constrain(x, ("batch",) + (None,) * (x.ndim - 1))

    head = None if tl.lp_head is None else batch_layout(tl.lp_head)
    tl = tl._replace(lp=batch_layout(tl.lp), lp_head=head, entropy=batch_layout(tl.entropy))
    if not with_routing:
        return tl
    if routing is None:
        return tl, None
    c = model.config
    return tl, (routing, [c.is_sparse(i) for i in range(c.num_hidden_layers)])


def make_snapshot_logprobs(graphdef, cfg: StepConfig):
    """Jitted ``(params_s, batch) -> (lp_s, lps_head | zeros)``, no gradients."""

    def one(params_s, batch):
        tl = policy_logprobs(graphdef, params_s, batch, cfg)
        if tl.lp_head is None:
            return tl.lp, jnp.zeros(batch["lq_head"].shape, jnp.float32)
        return tl.lp, tl.lp_head

    @jax.jit
    def fn(params_s, batch):
        params_s = jax.lax.stop_gradient(params_s)
        m = cfg.micro_batches
        if m == 1:
            return one(params_s, batch)
        mbs = jax.tree.map(lambda x: split_micro_batches(x, m), batch)
        lp, lps_head = jax.lax.map(lambda mb: one(params_s, mb), mbs)
        return merge_micro_batches(lp), merge_micro_batches(lps_head)

    return fn


def _loss_fn(params, graphdef, mb: dict, num_tokens, cfg: StepConfig, frozen=None, key=None):
    params = join_trainable(params, frozen)  # a LoRA base: frozen, joined for the forward
    moe = "routed_experts" in mb or cfg.load_balance_loss > 0
    out = policy_logprobs(graphdef, params, mb, cfg, with_routing=moe, dropout_key=key)
    tl, routing = out if moe else (out, None)
    sg = jax.lax.stop_gradient
    self_m = mb["self_mask"]
    lp_s = jnp.where(self_m, sg(tl.lp), mb["lp_s"])
    lps_head = jnp.where(self_m[..., None], sg(tl.lp_head), mb["lps_head"]) if cfg.head_k else None
    lp_old = {"current": None, "sampler": mb["lp_q"], "snapshot": lp_s}[cfg.old_policy]
    inputs = LossInputs(
        lp=tl.lp,
        lp_q=mb["lp_q"],
        mask=mb["mask"],
        adv=mb["adv"],
        lp_s=lp_s,
        lp_old=lp_old,
        lp_head=tl.lp_head,
        lps_head=lps_head,
        lq_head=mb["lq_head"] if cfg.head_k else None,
        num_tokens=num_tokens,
    )
    loss, metrics = compute_loss(cfg.loss, inputs)
    if routing is not None:  # a mixture-of-experts model (dlc_jax.model.routing)
        loss, metrics = _moe_terms(routing[1], routing[0], mb, loss, metrics, cfg)
    lp_head = None if tl.lp_head is None else sg(tl.lp_head)
    return loss, (metrics, sg(tl.lp), lp_s, sg(tl.entropy), lp_head)


def _moe_terms(sparse_layers, routing, mb: dict, loss, metrics: dict, cfg: StepConfig):
    """The load-balancing loss term and, when replaying, the routing-mismatch metrics."""
    from dlc_jax.model.routing import routing_mismatch

    metrics = dict(metrics)
    if cfg.load_balance_loss > 0:
        loss = loss + cfg.load_balance_loss * routing.aux_loss
    metrics["moe/load_balance_loss"] = routing.aux_loss
    if "routed_experts" in mb:
        metrics.update(
            routing_mismatch(routing.experts, mb["routed_experts"], mb["mask"], sparse_layers)
        )
    return loss, metrics


def split_micro_batches(x, m: int):
    """[B, ...] -> [m, B/m, ...] with micro-batch i = rows i, i+m, i+2m, ...: strided, so every
    device of a row-sharded batch holds an equal share of every micro-batch."""
    b = x.shape[0]
    if b % m:
        raise ValueError(f"micro_batches={m} must divide the {b} rows of the batch")
    return jnp.swapaxes(x.reshape((b // m, m) + x.shape[1:]), 0, 1)


def merge_micro_batches(x):
    """Inverse of :func:`split_micro_batches`: [m, B/m, ...] -> [B, ...] in the original order."""
    m, r = x.shape[:2]
    return jnp.swapaxes(x, 0, 1).reshape((m * r,) + x.shape[2:])


_SUMMED_LOSS_METRICS = ("loss", "nonfinite_tokens", "valid_tokens")


def accumulate_grads(params, graphdef, batch: dict, cfg: StepConfig, frozen=None, key=None):
    """Gradients summed over ``cfg.micro_batches`` micro-batches (``jax.lax.scan``), normalized by
    the batch's token count: ``(grads, loss_metrics, lp, lp_s, entropy, lp_head)`` in row order,
    the loss metrics summed ('loss', token counts) or averaged. ``frozen``: parameters without
    gradients (a LoRA base); ``key``: the LoRA dropout key, split per micro-batch."""
    m = cfg.micro_batches
    num_tokens = jnp.sum(batch["mask"])
    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)

    def body(grads, xs):
        mb, k = xs
        out, g = grad_fn(params, graphdef, mb, num_tokens, cfg, frozen, k)
        lm, lp, lp_s, ent, lp_head = out[1]
        lm = {k: jnp.asarray(v, jnp.float32) for k, v in lm.items()}
        return jax.tree.map(jnp.add, grads, g), (lm, lp, lp_s, ent, lp_head)

    grads0 = jax.tree.map(jnp.zeros_like, params)
    mbs = jax.tree.map(lambda x: split_micro_batches(x, m), batch)
    keys = None if key is None else jax.random.split(key, m)
    grads, (lms, lp, lp_s, ent, lp_head) = jax.lax.scan(body, grads0, (mbs, keys))
    lm = {k: jnp.sum(v) if k in _SUMMED_LOSS_METRICS else jnp.mean(v) for k, v in lms.items()}
    lp, lp_s, ent = (merge_micro_batches(x) for x in (lp, lp_s, ent))
    return grads, lm, lp, lp_s, ent, None if lp_head is None else merge_micro_batches(lp_head)


def make_train_step(
    graphdef,
    tx,
    cfg: StepConfig,
    *,
    mesh=None,
    param_shardings=None,
    opt_shardings=None,
    trainable=None,
):
    """Jitted ``(params, opt_state, batch) -> (params, opt_state, metrics)``.

    With ``mesh``: params/opt state on ``param_shardings``/``opt_shardings``, batch rows over
    ('data', 'fsdp'), metrics replicated. With ``trainable`` (an NNX filter, e.g. LoRA's adapters;
    ``opt_state`` over those alone) only that part trains; the frozen rest is an input of the jitted
    step but not an output (never copied), split off and joined back outside jit.
    """
    step = _train_step_body(graphdef, tx, cfg)
    if mesh is None:
        jitted = jax.jit(step)
    else:
        train_sh, frozen_sh = split_trainable(param_shardings, trainable)
        frozen_in = () if trainable is None else (frozen_sh,)
        jitted = jax.jit(
            step,
            in_shardings=(train_sh, opt_shardings, _rows(mesh), *frozen_in),
            out_shardings=(train_sh, opt_shardings, NamedSharding(mesh, P())),
        )
    return jitted if trainable is None else _PartialStep(jitted, trainable)


def _rows(mesh) -> NamedSharding:
    return NamedSharding(mesh, P(("data", "fsdp")))


def _train_step_body(graphdef, tx, cfg: StepConfig):
    """The step ``(params, opt_state, batch, frozen=None) -> (params, opt_state, metrics)``."""

    def step(params, opt_state, batch, frozen=None):
        key = None
        if cfg.lora_dropout:  # LoRA adapter dropout: the masks' key from the update count
            from dlc_jax.lora.dropout import step_key

            key = step_key(opt_state, cfg.lora_seed)
        grads, lm, lp, lp_s, ent, lp_head = accumulate_grads(
            params, graphdef, batch, cfg, frozen, key
        )
        lr_scale = lm.get("lr_scale", 1.0)
        gnorm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
        params, opt_state = apply_updates(tx, params, opt_state, grads, lr_scale)
        metrics = {f"loss/{k}": v for k, v in lm.items()}
        metrics.update(
            step_metrics(
                lp,
                lp_s,
                batch["lp_q"],
                batch["mask"],
                lq_head=batch["lq_head"] if cfg.head_k else None,
                lp_head=lp_head if cfg.head_k else None,
                entropy=ent,
            )
        )
        dec = resync_decision(
            lp, lp_s, batch["mask"], cfg.resync_threshold, statistic=cfg.resync_statistic
        )
        metrics.update(
            grad_norm=gnorm,
            lr_scale=jnp.asarray(lr_scale, jnp.float32),
            resync_wanted=dec.resync.astype(jnp.float32),
        )
        return params, opt_state, metrics

    return step


class _PartialStep:
    """The step training only part of ``params`` (split and joined on host)."""

    def __init__(self, jitted, trainable):
        self.jitted, self.trainable = jitted, trainable

    def _args(self, params, opt_state, batch):
        train, frozen = split_trainable(params, self.trainable)
        return (train, opt_state, batch, frozen), frozen

    def __call__(self, params, opt_state, batch):
        args, frozen = self._args(params, opt_state, batch)
        train, opt_state, metrics = self.jitted(*args)
        return join_trainable(train, frozen), opt_state, metrics

    def lower(self, params, opt_state, batch):
        return self.jitted.lower(*self._args(params, opt_state, batch)[0])


def device_batch(batch: dict, mesh=None) -> dict:
    """The ``STEP_KEYS`` arrays of ``batch`` on device (rows over ('data', 'fsdp') with a mesh)."""
    if missing := [k for k in STEP_KEYS if k not in batch and k not in OPTIONAL_STEP_KEYS]:
        raise KeyError(f"step batch is missing arrays {missing}")
    keys = [k for k in STEP_KEYS if k in batch]
    if mesh is None:
        return {k: jnp.asarray(batch[k]) for k in keys}
    return {k: jax.device_put(batch[k], _rows(mesh)) for k in keys}
