"""Qwen3ForCausalLM in Flax NNX.

The module tree mirrors the HF names (`model.embed_tokens`, `model.layers[i].self_attn.q_proj`, ...,
`model.norm`, `lm_head`) so HF conversion is transpose/reshape only (see `hf_io.py`). A scanned
model (`config.use_scan`) has one `model.layers` whose parameters carry a leading [L] axis
("layers"):

    embedding / lm_head `weight`  [V, D]            (HF layout)
    norms `weight`                [D] or [head_dim]  (HF layout)
    projections `kernel`          in_dims + out_dims (HF weight transposed, then reshaped):
        q_proj [D, H, hd]   k_proj / v_proj [D, KV, hd]   o_proj [H, hd, D]
        gate_proj / up_proj [D, F]                         down_proj [F, D]

Shapes: B batch, T time, S cache length, D hidden, H query heads, KV key/value heads,
hd head_dim, F intermediate, V vocab, L layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from .attention import dense_attention, masked_attention, resolve_impl, self_attention
from .config import Qwen3Config
from .sharding import ActivationSharding
from .stack import ATTN_OUT, make_stacked, resolve_remat, run_layers, run_layers_with_cache


def _param(rngs: nnx.Rngs | None, shape, dtype, logical, init: str):
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
        self.weight = _param(None, (dim,), param_dtype, logical, "ones")

    def __call__(self, x):
        dt = x.dtype
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight.get_value().astype(dt) * y.astype(dt)


class Projection(nnx.Module):
    """Bias-free linear map contracting the last len(in_shape) axes.

    kernel: [*in_shape, *out_shape]."""

    def __init__(self, in_shape, out_shape, logical, *, rngs, param_dtype, compute_dtype):
        self.n_in = len(in_shape)
        self.compute_dtype = compute_dtype
        self.kernel = _param(
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
        self.weight = _param(rngs, (vocab, dim), param_dtype, ("vocab", "embed"), "normal")

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


def attend(q, k, v, mask):
    """Grouped-query attention. q [B,T,H,hd], k/v [B,S,KV,hd], mask [B,T,S] bool -> [B,T,H,hd]
    (the dense reference, `attention.dense_attention`)."""
    return dense_attention(q, k, v, mask)


class Qwen3Attention(nnx.Module):
    def __init__(self, cfg: Qwen3Config, *, rngs, param_dtype, compute_dtype, act_sharding):
        d, h, kv, hd = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
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

        k/v_cache: [B,S,KV,hd] (layer None) or the stacked [L,B,S,KV,hd] with this layer at `layer`
        (updated in place inside the scan)."""
        q, k, v = self.qkv(x, cos, sin)
        if layer is None:
            k_cache = jax.lax.dynamic_update_slice(
                k_cache, k.astype(k_cache.dtype), (0, index, 0, 0)
            )
            v_cache = jax.lax.dynamic_update_slice(
                v_cache, v.astype(v_cache.dtype), (0, index, 0, 0)
            )
            k_all, v_all = k_cache, v_cache
        else:
            at = (layer, 0, index, 0, 0)
            k_cache = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype)[None], at)
            v_cache = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype)[None], at)
            k_all = jax.lax.dynamic_index_in_dim(k_cache, layer, 0, keepdims=False)
            v_all = jax.lax.dynamic_index_in_dim(v_cache, layer, 0, keepdims=False)
        dt = q.dtype
        impl = (
            "dense"
            if resolve_impl(self.attention_impl, self.act_sharding.mesh, dt) == "dense"
            else "xla"
        )
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
    def __init__(self, cfg: Qwen3Config, *, rngs, param_dtype, compute_dtype, act_sharding):
        kw = dict(
            rngs=rngs,
            param_dtype=param_dtype,
            compute_dtype=compute_dtype,
            act_sharding=act_sharding,
        )
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)
        self.self_attn = Qwen3Attention(cfg, **kw)
        self.post_attention_layernorm = RMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype
        )
        self.mlp = Qwen3MLP(cfg, **kw)
        self.act_sharding = act_sharding

    def __call__(self, x, cos, sin, valid, segment_ids=None):
        c = self.act_sharding.constrain
        a = self.self_attn(self.input_layernorm(x), cos, sin, valid, segment_ids)
        h = c(x + a, ("batch", "length", "act_embed"))
        return c(h + self.mlp(self.post_attention_layernorm(h)), ("batch", "length", "act_embed"))

    def with_cache(self, x, cos, sin, mask, k_cache, v_cache, index, layer=None):
        a, k_cache, v_cache = self.self_attn.with_cache(
            self.input_layernorm(x), cos, sin, mask, k_cache, v_cache, index, layer
        )
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h)), k_cache, v_cache


class Qwen3Model(nnx.Module):
    """`layers`: an nnx.List of L decoder layers, or (config.use_scan) one decoder layer whose
    parameters are stacked [L, ...] on the logical axis 'layers'."""

    def __init__(self, cfg: Qwen3Config, *, rngs, param_dtype, compute_dtype, act_sharding):
        kw = dict(rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, **kw)

        make_layer = type(self).make_layer  # a classmethod: the vmapped builder captures no module

        def layer(r, i=0):
            return make_layer(
                cfg,
                i,
                rngs=r,
                param_dtype=param_dtype,
                compute_dtype=compute_dtype,
                act_sharding=act_sharding,
            )

        if cfg.use_scan:
            self.layers = make_stacked(layer, cfg.num_hidden_layers, rngs)
        else:
            self.layers = nnx.List([layer(rngs, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)

    @classmethod
    def make_layer(cls, cfg, index: int, **kw) -> nnx.Module:
        """Decoder layer `index` (a scanned model builds index 0 and stacks it)."""
        del index
        return Qwen3DecoderLayer(cfg, **kw)


class LMHead(nnx.Module):
    """Untied output projection `weight` [V, D] (HF layout)."""

    def __init__(self, vocab: int, dim: int, *, rngs, param_dtype):
        self.weight = _param(rngs, (vocab, dim), param_dtype, ("vocab", "embed"), "normal")


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


class Qwen3ForCausalLM(nnx.Module):
    """Qwen3 causal LM. Parameters in `param_dtype`, math in `compute_dtype` (norms, softmax fp32).

    How it runs comes from the config (`attention_impl`, `scan_layers`, `remat_policy`; see
    docs/MODEL.md). `remat` overrides the config's policy: True = rematerialize each decoder layer
    (the config's policy, or 'full' when that is 'none'), a policy name = that policy.
    """

    body_cls: type = Qwen3Model  # the decoder stack (`model.*`); a family subclass swaps it

    def __init__(
        self,
        config: Qwen3Config,
        *,
        rngs: nnx.Rngs | None = None,
        param_dtype=jnp.float32,
        compute_dtype=jnp.float32,
        remat: bool | str | None = None,
        act_sharding: ActivationSharding | None = None,
    ):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        act_sharding = act_sharding or ActivationSharding()
        self.config = config
        self.param_dtype = jnp.dtype(param_dtype)
        self.compute_dtype = jnp.dtype(compute_dtype)
        self.remat_policy = resolve_remat(remat, config.remat_policy)
        self.remat = self.remat_policy != "none"
        self.scanned = config.use_scan
        self.act_sharding = act_sharding
        self.hf_source: str | None = (
            None  # directory loaded from (tokenizer files are copied on save)
        )
        self.model = self.body_cls(
            config,
            rngs=rngs,
            param_dtype=param_dtype,
            compute_dtype=compute_dtype,
            act_sharding=act_sharding,
        )
        if not config.tie_word_embeddings:
            self.lm_head = LMHead(
                config.vocab_size, config.hidden_size, rngs=rngs, param_dtype=param_dtype
            )
        else:
            self.lm_head = None  # type: ignore[assignment]

    # ---- public API -----------------------------------------------------------------------
    def unembedding(self):
        """[V, D] output matrix (lm_head.weight, or the embedding table when tied), param dtype."""
        if self.lm_head is None:
            return self.model.embed_tokens.weight.get_value()
        return self.lm_head.weight.get_value()

    def hidden_states(self, input_ids, attention_mask=None, positions=None, segment_ids=None):
        """input_ids [B,T] int -> final-norm hidden states [B,T,D] (compute dtype).

        attention_mask [B,T] (1 = real token; left or right padding), positions [B,T] (default
        cumsum(mask)-1, or restart per segment), segment_ids [B,T] (packed sequences attend only
        within their segment).
        """
        input_ids = jnp.asarray(input_ids)
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        attention_mask = jnp.asarray(attention_mask)
        if segment_ids is not None:
            segment_ids = jnp.asarray(segment_ids)
        if positions is None:
            positions = default_positions(attention_mask, segment_ids)
        valid = attention_mask.astype(bool)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        c = self.act_sharding.constrain
        x = c(self.model.embed_tokens(input_ids), ("batch", "length", "act_embed"))

        def step(layer, h):
            return layer(h, cos, sin, valid, segment_ids)

        x = run_layers(self.model.layers, x, step, scanned=self.scanned, policy=self.remat_policy)
        return self.model.norm(x)

    def logits_from_hidden(self, h):
        """h [..., D] -> logits [..., V] in compute dtype."""
        w = self.unembedding().astype(self.compute_dtype)
        out = jnp.einsum("...d,vd->...v", h.astype(self.compute_dtype), w)
        if out.ndim == 3:
            out = self.act_sharding.constrain(out, ("batch", "length", "vocab"))
        return out

    def __call__(self, input_ids, attention_mask=None, positions=None, segment_ids=None):
        """input_ids [B,T] -> logits [B,T,V] (compute dtype); arguments as in `hidden_states`."""
        return self.logits_from_hidden(
            self.hidden_states(input_ids, attention_mask, positions, segment_ids)
        )

    # ---- KV cache (JAX sampler backend) -------------------------------------------------------
    def init_cache(self, batch: int, max_len: int, dtype=None) -> dict:
        """Empty cache: valid [B,S] bool (slot holds a real token); index [] int32; k, v: stacked
        [L,B,S,KV,hd] arrays for a scanned model, tuples of L [B,S,KV,hd] arrays otherwise. Each
        forward writes its slots in place (jit callers should donate the cache)."""
        cfg = self.config
        dtype = self.compute_dtype if dtype is None else dtype
        shape = (batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
        k: jax.Array | tuple[jax.Array, ...]
        v: jax.Array | tuple[jax.Array, ...]
        if self.scanned:
            k = jnp.zeros((cfg.num_hidden_layers, *shape), dtype)
            v = jnp.zeros((cfg.num_hidden_layers, *shape), dtype)
        else:
            k = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_hidden_layers))
            v = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_hidden_layers))
        return {
            "k": k,
            "v": v,
            "valid": jnp.zeros((batch, max_len), bool),
            "index": jnp.zeros((), jnp.int32),
        }

    def forward_with_cache(self, input_ids, positions, cache: dict, attention_mask=None):
        """Append T tokens to the cache and return their logits.

        input_ids, positions [B,T] int; attention_mask [B,T] (1 = real token; default all real).
        Tokens go to slots [index, index+T); each query attends to valid slots <= its own slot.
        Prefill a left-padded prompt batch with T = prompt length (positions = cumsum(mask)-1),
        then decode with T = 1. Returns (logits [B,T,V], new cache). Static shapes, jittable.
        """
        input_ids = jnp.asarray(input_ids)
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        index = cache["index"]
        s = cache["valid"].shape[1]
        valid = jax.lax.dynamic_update_slice(
            cache["valid"], jnp.asarray(attention_mask).astype(bool), (0, index)
        )
        q_slot = index + jnp.arange(t)
        mask = (jnp.arange(s)[None, :] <= q_slot[:, None])[None] & valid[:, None, :]
        cos, sin = rope_cos_sin(
            jnp.asarray(positions), self.config.head_dim, self.config.rope_theta
        )
        x = self.model.embed_tokens(input_ids)

        def step(layer, h, k_c, v_c, i):
            return layer.with_cache(h, cos, sin, mask, k_c, v_c, index, i)

        x, ks, vs = run_layers_with_cache(
            self.model.layers, x, cache["k"], cache["v"], step, scanned=self.scanned
        )
        logits = self.logits_from_hidden(self.model.norm(x))
        return logits, {"k": ks, "v": vs, "valid": valid, "index": index + t}
