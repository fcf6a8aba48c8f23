"""Qwen3MoeForCausalLM in Flax NNX: Qwen3 attention, mixture-of-experts MLPs, routing replay.
A sparse layer's `mlp` keeps HF's names: `mlp.gate.weight` [E, D] (router, float32 logits),
`mlp.experts.{gate,up}_proj.kernel` [E, D, I], `mlp.experts.down_proj.kernel` [E, I, D]. Routing,
`moe_impl` (ragged, megablox, dense) and replay: docs/MODEL.md, "Qwen3-MoE"."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from .attention import mesh_platform
from .blocks import Qwen3DecoderLayer, param
from .config import Qwen3MoeConfig
from .moe_dispatch import megablox_experts, resolve_moe_impl
from .qwen3 import Qwen3ForCausalLM, Qwen3Model


class Routing(NamedTuple):
    """`experts` [B, T, L, K] int32 (own top-k; 0 at dense layers), `aux_loss` [] (sparse mean)."""

    experts: jax.Array
    aux_loss: jax.Array


def route(logits, k: int, norm_topk_prob: bool, replay=None):
    """Router logits [N, E] (float32) -> (weights [N, K] f32, used experts [N, K], own top-k
    [N, K], probs [N, E]). With `replay` [N, K], the used experts are the replayed ones and the
    weights are this router's probabilities at them."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top_w, top_i = jax.lax.top_k(probs, k)
    if replay is None:
        used, w = top_i, top_w
    else:
        used = replay.astype(jnp.int32)
        w = jnp.take_along_axis(probs, used, axis=-1)
    if norm_topk_prob:
        w = w / jnp.sum(w, axis=-1, keepdims=True)
    return w, used, top_i.astype(jnp.int32), probs


def load_balance_loss(probs, top_i, valid, num_experts: int):
    """Switch/HF load-balancing loss E * sum_e f_e * P_e over valid tokens: f_e = share of the
    (token, slot) assignments that went to expert e, P_e = mean router probability of e."""
    v = valid.astype(jnp.float32)[:, None]
    n = jnp.maximum(jnp.sum(v), 1.0)
    counts = jnp.sum(jax.nn.one_hot(top_i, num_experts, dtype=jnp.float32) * v[..., None], (0, 1))
    f = counts / (n * top_i.shape[-1])
    p = jnp.sum(probs * v, axis=0) / n
    return num_experts * jnp.sum(f * p)


class Experts(nnx.Module):
    """E SwiGLU experts, weights stacked on the expert axis (`exp`)."""

    def __init__(self, cfg: Qwen3MoeConfig, *, rngs, param_dtype, compute_dtype, act_sharding):
        e, d, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.compute_dtype = compute_dtype
        self.impl = cfg.moe_impl
        self.dispatch = cfg.moe_dispatch
        self.act_sharding = act_sharding
        self.gate_proj = _Kernel((e, d, i), ("exp", "embed", "moe_mlp"), rngs, param_dtype)
        self.up_proj = _Kernel((e, d, i), ("exp", "embed", "moe_mlp"), rngs, param_dtype)
        self.down_proj = _Kernel((e, i, d), ("exp", "moe_mlp", "embed"), rngs, param_dtype)

    def __call__(self, x, experts, weights):
        """x [B, T, D], experts / weights [B, T, K] -> sum_k weights[..., k] * expert_k(x)."""
        dt = self.compute_dtype
        wg, wu, wd = (
            p.kernel.get_value().astype(dt) for p in (self.gate_proj, self.up_proj, self.down_proj)
        )
        x = x.astype(dt)
        weights = weights.astype(dt)
        mesh = self.act_sharding.mesh
        impl = resolve_moe_impl(self.impl, mesh)
        if impl == "megablox":
            kw: dict[str, Any] = dict(mesh=mesh, rules=self.act_sharding.rules)
            kw.update(interpret=mesh_platform(mesh) != "tpu", dispatch=self.dispatch)
            return megablox_experts(x, experts, weights, wg, wu, wd, **kw)
        b, t, d = x.shape
        x, experts, weights = (a.reshape(b * t, -1) for a in (x, experts, weights))
        if impl == "dense":
            h = jax.nn.silu(jnp.einsum("nd,edi->nei", x, wg)) * jnp.einsum("nd,edi->nei", x, wu)
            out = jnp.einsum("nei,eid->ned", h, wd)
            combine = jnp.sum(
                jax.nn.one_hot(experts, wg.shape[0], dtype=dt) * weights[..., None], axis=1
            )
            return jnp.einsum("ned,ne->nd", out, combine).reshape(b, t, d)
        n, k = experts.shape
        flat = experts.reshape(-1)
        order = jnp.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
        sizes = jnp.bincount(flat, length=wg.shape[0]).astype(jnp.int32)
        xs = jnp.take(x, order // k, axis=0)
        h = jax.nn.silu(jax.lax.ragged_dot(xs, wg, sizes)) * jax.lax.ragged_dot(xs, wu, sizes)
        ys = jax.lax.ragged_dot(h, wd, sizes)
        out = jnp.zeros_like(ys).at[order].set(ys).reshape(n, k, -1)
        return jnp.sum(out * weights[..., None], axis=1).reshape(b, t, d)


class _Kernel(nnx.Module):
    """A bare `kernel` parameter (the expert projections' HF name, `...gate_proj.weight`)."""

    def __init__(self, shape, logical, rngs, param_dtype):
        self.kernel = param(rngs, shape, param_dtype, logical, "normal")


class Router(nnx.Module):
    """`weight` [E, D] (HF layout), applied in float32."""

    def __init__(self, cfg: Qwen3MoeConfig, *, rngs, param_dtype):
        shape = (cfg.num_experts, cfg.hidden_size)
        self.weight = param(rngs, shape, param_dtype, ("exp", "embed"), "normal")

    def __call__(self, x):
        w = self.weight.get_value().astype(jnp.float32)
        return jnp.einsum("nd,ed->ne", x.astype(jnp.float32), w)


class Qwen3MoeSparseBlock(nnx.Module):
    def __init__(self, cfg: Qwen3MoeConfig, *, rngs, param_dtype, **kw):
        self.gate = Router(cfg, rngs=rngs, param_dtype=param_dtype)
        self.experts = Experts(cfg, rngs=rngs, param_dtype=param_dtype, **kw)
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.num_experts = cfg.num_experts

    def __call__(self, x, valid, replay=None):
        """x [B,T,D], valid [B,T], replay [B,T,K] | None -> (y, own top-k [B,T,K], aux loss [])."""
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        rep = None if replay is None else replay.reshape(b * t, -1)
        w, used, top_i, probs = route(self.gate(flat), self.top_k, self.norm_topk_prob, rep)
        y = self.experts(x, used.reshape(b, t, -1), w.reshape(b, t, -1))
        aux = load_balance_loss(probs, top_i, valid.reshape(-1), self.num_experts)
        return y, top_i.reshape(b, t, -1), aux


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    """Qwen3's decoder layer, sparse where `cfg.is_sparse`; outputs (own top-k, aux loss)."""

    def __init__(self, cfg: Qwen3MoeConfig, index: int = 0, **kw):
        self.sparse = cfg.is_sparse(index)
        self.top_k = cfg.num_experts_per_tok
        super().__init__(cfg, index, **kw)

    def make_mlp(self, cfg, index: int, **kw) -> nnx.Module:
        return Qwen3MoeSparseBlock(cfg, **kw) if self.sparse else super().make_mlp(cfg, index, **kw)

    def feed_forward(self, x, valid, replay):
        if self.sparse:
            y, top_i, aux = self.mlp(x, valid, replay)
            return y, (top_i, aux)
        b, t, _ = x.shape
        return self.mlp(x), (jnp.zeros((b, t, self.top_k), jnp.int32), jnp.zeros((), jnp.float32))


class Qwen3MoeModel(Qwen3Model):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE causal LM: `Qwen3ForCausalLM` whose `hidden_states` / `__call__` take
    `routed_experts` (replay) and, with `return_routing=True`, return `(output, Routing)`."""

    body_cls = Qwen3MoeModel
    config: Qwen3MoeConfig

    def hidden_states(
        self,
        input_ids,
        attention_mask=None,
        positions=None,
        segment_ids=None,
        routed_experts=None,
        return_routing: bool = False,
    ):
        """As `Qwen3ForCausalLM.hidden_states`; `routed_experts` [B, T, L, K] int replays those
        experts in every sparse layer. Returns h [B, T, D], or (h, Routing)."""
        xs = None
        if routed_experts is not None:
            xs = jnp.moveaxis(jnp.asarray(routed_experts, jnp.int32), 2, 0)  # [L, B, T, K]
        h, (top_i, aux) = self.run_stack(input_ids, attention_mask, positions, segment_ids, xs)
        if not return_routing:
            return h
        n_sparse = sum(self.config.is_sparse(i) for i in range(self.config.num_hidden_layers))
        routing = Routing(jnp.moveaxis(top_i, 0, 2), jnp.sum(aux) / max(n_sparse, 1))
        return h, routing

    def __call__(self, *args, **kwargs):
        """Logits [B, T, V] of `hidden_states(...)`, or `(logits, Routing)`."""
        out = self.hidden_states(*args, **kwargs)
        if isinstance(out, tuple):
            return self.logits_from_hidden(out[0]), out[1]
        return self.logits_from_hidden(out)

    def forward_with_cache(
        self, input_ids, positions, cache: dict, attention_mask=None, return_routing=False
    ):
        """As `Qwen3ForCausalLM.forward_with_cache`, plus routed experts [B,T,L,K] on request."""
        logits, new_cache, (top_i, _) = self.run_stack_with_cache(
            input_ids, positions, cache, attention_mask
        )
        if return_routing:
            return logits, new_cache, jnp.moveaxis(top_i, 0, 2)
        return logits, new_cache
