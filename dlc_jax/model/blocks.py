"""The layers the Qwen3 families (dense and MoE) share. Parameter layouts (HF names):
    embedding / lm_head `weight`  [V, D]            (HF layout)
    norms `weight`                [D] or [head_dim]  (HF layout)
    projections `kernel`          in_dims + out_dims (HF weight transposed, then reshaped):
        q_proj [D, H, hd]   k_proj / v_proj [D, KV, hd]   o_proj [H, hd, D]
        gate_proj / up_proj [D, F]                         down_proj [F, D]

Shapes: B batch, T time, S cache length, D hidden, H query heads, KV key/value heads,
hd head_dim, F intermediate, V vocab, L layers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from .attention import masked_attention, resolve_impl, self_attention
from .config import Qwen3Config
from .stack import ATTN_OUT


def param(rngs: nnx.Rngs | None, shape, dtype, logical, init: str):
    if init == "ones":
        value = jnp.ones(shape, dtype)
    else:
        key = rngs.params() if rngs is not None else jax.random.key(0)
        value = (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, out_sharding=tuple(logical), eager_sharding=False)


class RMSNorm(nnx.Module):
    """y = weight * x / sqrt(mean(x^2) + eps), normalized in float32 over the last axis."""

    def __init__(self, dim: int, eps: float, *, param_dtype, logical=("norm",)):
        self.eps = eps
        self.weight = param(None, (dim,), param_dtype, logical, "ones")

    def __call__(self, x):
        dt = x.dtype
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight.get_value().astype(dt) * y.astype(dt)


class Projection(nnx.Module):
    """Bias-free linear map contracting the last len(in_shape) axes; kernel [*in, *out]."""

    def __init__(self, in_shape, out_shape, logical, *, rngs, param_dtype, compute_dtype):
        self.n_in = len(in_shape)
        self.compute_dtype = compute_dtype
        self.kernel = param(
            rngs, tuple(in_shape) + tuple(out_shape), param_dtype, logical, "normal"
        )

    def __call__(self, x):
        k = self.kernel.get_value().astype(self.compute_dtype)
        y = jnp.tensordot(x.astype(self.compute_dtype), k, axes=self.n_in)
        lora = getattr(self, "lora", None)  # a LoRA adapter (dlc_jax.lora), when one was added
        return y if lora is None else y + lora(x)


class Embedding(nnx.Module):
    """Token embedding table `weight` [V, D]."""

    def __init__(self, vocab: int, dim: int, *, rngs, param_dtype, compute_dtype):
        self.compute_dtype = compute_dtype
        self.weight = param(rngs, (vocab, dim), param_dtype, ("vocab", "embed"), "normal")

    def __call__(self, ids):
        return jnp.take(self.weight.get_value(), ids, axis=0).astype(self.compute_dtype)


def rope_cos_sin(positions, head_dim: int, theta: float):
    """positions [B, T] int -> (cos, sin) [B, T, hd] float32 (HF "rotate_half" convention)."""
    inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    f = positions.astype(jnp.float32)[..., None] * inv
    emb = jnp.concatenate([f, f], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
    """x [B, T, N, hd] rotated by cos/sin [B, T, hd]."""
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    c, s = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * c + rot * s


class Qwen3Attention(nnx.Module):
    def __init__(self, cfg: Qwen3Config, *, rngs, param_dtype, compute_dtype, act_sharding):
        d, h = cfg.hidden_size, cfg.num_attention_heads
        kv, hd = cfg.num_key_value_heads, cfg.head_dim
        kw = dict(rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)
        self.q_proj = Projection((d,), (h, hd), ("embed", "heads", "head_dim"), **kw)
        self.k_proj = Projection((d,), (kv, hd), ("embed", "kv_heads", "head_dim"), **kw)
        self.v_proj = Projection((d,), (kv, hd), ("embed", "kv_heads", "head_dim"), **kw)
        self.o_proj = Projection((h, hd), (d,), ("heads", "head_dim", "embed"), **kw)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, param_dtype=param_dtype, logical=("head_dim",))
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, param_dtype=param_dtype, logical=("head_dim",))
        self.attention_impl = cfg.attention_impl
        self.act_sharding = act_sharding

    def qkv(self, x, cos, sin):
        """x [B,T,D] -> q [B,T,H,hd], k, v [B,T,KV,hd] (normed, rotated)."""
        c = self.act_sharding.constrain
        q = c(self.q_norm(self.q_proj(x)), ("batch", "length", "heads", "head_dim"))
        k = c(self.k_norm(self.k_proj(x)), ("batch", "length", "kv_heads", "head_dim"))
        v = c(self.v_proj(x), ("batch", "length", "kv_heads", "head_dim"))
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def __call__(self, x, cos, sin, valid, segment_ids=None):
        """Causal self-attention; valid [B,T] bool, segment_ids [B,T] or None (see attention.py)."""
        q, k, v = self.qkv(x, cos, sin)
        a = self.act_sharding
        out = self_attention(
            q, k, v, valid, segment_ids, impl=self.attention_impl, mesh=a.mesh, rules=a.rules
        )
        return self.o_proj(checkpoint_name(out, ATTN_OUT))

    def with_cache(self, x, cos, sin, mask, k_cache, v_cache, index, layer=None):
        """Write this step's k/v at slots [index, index+T) of k/v_cache and attend over all S slots.
        k/v_cache: [B,S,KV,hd] (layer None) or stacked [L,B,S,KV,hd] with this layer at `layer`."""
        q, k, v = self.qkv(x, cos, sin)

        def write(cache, new):
            if layer is None:
                cache = jax.lax.dynamic_update_slice(
                    cache, new.astype(cache.dtype), (0, index, 0, 0)
                )
                return cache, cache
            at = (layer, 0, index, 0, 0)
            cache = jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype)[None], at)
            return cache, jax.lax.dynamic_index_in_dim(cache, layer, 0, keepdims=False)

        (k_cache, k_all), (v_cache, v_all) = write(k_cache, k), write(v_cache, v)
        dt = q.dtype
        dense = resolve_impl(self.attention_impl, self.act_sharding.mesh, dt) == "dense"
        impl = "dense" if dense else "xla"
        out = masked_attention(q, k_all.astype(dt), v_all.astype(dt), mask, impl)
        return self.o_proj(out), k_cache, v_cache


class Qwen3MLP(nnx.Module):
    def __init__(self, cfg: Qwen3Config, *, rngs, param_dtype, compute_dtype, act_sharding):
        d, f = cfg.hidden_size, cfg.intermediate_size
        kw = dict(rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)
        self.gate_proj = Projection((d,), (f,), ("embed", "mlp"), **kw)
        self.up_proj = Projection((d,), (f,), ("embed", "mlp"), **kw)
        self.down_proj = Projection((f,), (d,), ("mlp", "embed"), **kw)
        self.act_sharding = act_sharding

    def __call__(self, x):
        hmid = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        hmid = self.act_sharding.constrain(hmid, ("batch", "length", "mlp"))
        return self.down_proj(hmid)


class Qwen3DecoderLayer(nnx.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then h + mlp(norm(h)). A family subclass builds
    its MLP (`make_mlp`) and its per-layer output (`feed_forward`; Qwen3-MoE: the routing)."""

    def __init__(
        self, cfg: Qwen3Config, index: int = 0, *, rngs, param_dtype, compute_dtype, act_sharding
    ):
        kw = dict(rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)
        kw["act_sharding"] = act_sharding
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)
        self.self_attn = Qwen3Attention(cfg, **kw)
        self.post_attention_layernorm = RMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype
        )
        self.mlp = self.make_mlp(cfg, index, **kw)
        self.act_sharding = act_sharding

    def make_mlp(self, cfg: Qwen3Config, index: int, **kw) -> nnx.Module:
        del index
        return Qwen3MLP(cfg, **kw)

    def feed_forward(self, x, valid, replay):
        """The MLP on the normed x [B,T,D] -> (y [B,T,D], per-layer output: None here)."""
        del valid, replay
        return self.mlp(x), None

    def __call__(self, x, cos, sin, valid, segment_ids=None, replay=None):
        """-> (x [B,T,D], the `feed_forward` per-layer output)."""
        c = self.act_sharding.constrain
        a = self.self_attn(self.input_layernorm(x), cos, sin, valid, segment_ids)
        h = c(x + a, ("batch", "length", "act_embed"))
        m, out = self.feed_forward(self.post_attention_layernorm(h), valid, replay)
        return c(h + m, ("batch", "length", "act_embed")), out

    def with_cache(self, x, cos, sin, mask, valid, k_cache, v_cache, index, layer=None):
        """KV-cache step (`Qwen3Attention.with_cache`); valid [B,T] marks this step's real tokens.
        -> (x, k_cache, v_cache, the `feed_forward` per-layer output)."""
        a, k_cache, v_cache = self.self_attn.with_cache(
            self.input_layernorm(x), cos, sin, mask, k_cache, v_cache, index, layer
        )
        h = x + a
        m, out = self.feed_forward(self.post_attention_layernorm(h), valid, None)
        return h + m, k_cache, v_cache, out


class LMHead(nnx.Module):
    """Untied output projection `weight` [V, D] (HF layout)."""

    def __init__(self, vocab: int, dim: int, *, rngs, param_dtype):
        self.weight = param(rngs, (vocab, dim), param_dtype, ("vocab", "embed"), "normal")


def default_positions(attention_mask, segment_ids=None):
    """[B,T] positions: cumsum(mask)-1 clipped at 0; with segment_ids, restart at each segment."""
    if segment_ids is None:
        return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)
    t = segment_ids.shape[-1]
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids.shape)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
        axis=-1,
    )
    seg_start = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return idx - seg_start
