"""Qwen3ForCausalLM in Flax NNX. The module tree mirrors the HF names (`model.layers[i].self_attn.
q_proj`, ...), so HF conversion is transpose/reshape only; a scanned model (`config.use_scan`)
stacks the layers' parameters on a leading [L] axis. Shared layers and layouts: `blocks.py`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .blocks import Embedding, LMHead, Qwen3DecoderLayer, RMSNorm, default_positions, rope_cos_sin
from .config import Qwen3Config
from .sharding import ActivationSharding
from .stack import make_stacked, resolve_remat, run_layers, run_layers_with_cache


class Qwen3Model(nnx.Module):
    """`layers`: an nnx.List of L decoder layers, or (use_scan) one with parameters [L, ...]."""

    def __init__(self, cfg: Qwen3Config, *, rngs, param_dtype, compute_dtype, act_sharding):
        kw = dict(param_dtype=param_dtype, compute_dtype=compute_dtype)
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, rngs=rngs, **kw)

        make_layer = type(self).make_layer  # a classmethod: the vmapped builder captures no module

        def layer(r, i=0):
            return make_layer(cfg, i, rngs=r, act_sharding=act_sharding, **kw)

        if cfg.use_scan:
            self.layers = make_stacked(layer, cfg.num_hidden_layers, rngs)
        else:
            self.layers = nnx.List([layer(rngs, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)

    layer_cls: type[Qwen3DecoderLayer] = Qwen3DecoderLayer  # a family subclass swaps it

    @classmethod
    def make_layer(cls, cfg, index: int, **kw) -> nnx.Module:
        """Decoder layer `index` (a scanned model builds index 0 and stacks it)."""
        return cls.layer_cls(cfg, index, **kw)


class Qwen3ForCausalLM(nnx.Module):
    """Qwen3 causal LM. Parameters in `param_dtype`, math in `compute_dtype` (norms, softmax fp32).
    `remat` overrides the config's `remat_policy`: True = that policy ('full' if 'none'), or a
    policy name. See docs/MODEL.md."""

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
        self.hf_source: str | None = None  # directory loaded from (tokenizer files copied on save)
        kw = dict(param_dtype=param_dtype, compute_dtype=compute_dtype, act_sharding=act_sharding)
        self.model = self.body_cls(config, rngs=rngs, **kw)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else LMHead(config.vocab_size, config.hidden_size, rngs=rngs, param_dtype=param_dtype)
        )

    # ---- public API -----------------------------------------------------------------------
    def unembedding(self):
        """[V, D] output matrix (lm_head.weight, or the embedding table when tied), param dtype."""
        table = self.model.embed_tokens if self.lm_head is None else self.lm_head
        return table.weight.get_value()

    def hidden_states(self, input_ids, attention_mask=None, positions=None, segment_ids=None):
        """input_ids [B,T] int -> final-norm hidden states [B,T,D] (compute dtype).
        attention_mask [B,T] (1 = real token), positions [B,T] (default cumsum(mask)-1, restarting
        per segment), segment_ids [B,T] (packed sequences attend only within their segment)."""
        return self.run_stack(input_ids, attention_mask, positions, segment_ids)[0]

    def run_stack(self, input_ids, attention_mask=None, positions=None, segment_ids=None, xs=None):
        """`hidden_states` with a per-layer input `xs` ([L, ...] pytree or None, handed to each
        layer as `replay`) -> (h [B,T,D], the layers' per-layer outputs stacked on [L])."""
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

        def step(layer, h, x_l):
            return layer(h, cos, sin, valid, segment_ids, x_l)

        x, ys = run_layers(
            self.model.layers, x, xs, step, scanned=self.scanned, policy=self.remat_policy
        )
        return self.model.norm(x), ys

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
        shape, n = (batch, max_len, cfg.num_key_value_heads, cfg.head_dim), cfg.num_hidden_layers

        def empty() -> jax.Array | tuple[jax.Array, ...]:
            if self.scanned:
                return jnp.zeros((n, *shape), dtype)
            return tuple(jnp.zeros(shape, dtype) for _ in range(n))

        valid = jnp.zeros((batch, max_len), bool)
        return {"k": empty(), "v": empty(), "valid": valid, "index": jnp.zeros((), jnp.int32)}

    def forward_with_cache(self, input_ids, positions, cache: dict, attention_mask=None):
        """Append T tokens (input_ids, positions, attention_mask [B,T]) at slots [index, index+T);
        each query attends to valid slots <= its own. Prefill with T = prompt length, decode with
        T = 1. Returns (logits [B,T,V], new cache). Static shapes, jittable."""
        return self.run_stack_with_cache(input_ids, positions, cache, attention_mask)[:2]

    def run_stack_with_cache(self, input_ids, positions, cache: dict, attention_mask=None):
        """`forward_with_cache` -> (logits, new cache, the layers' per-layer outputs on [L])."""
        input_ids = jnp.asarray(input_ids)
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        index = cache["index"]
        s = cache["valid"].shape[1]
        new_valid = jnp.asarray(attention_mask).astype(bool)
        valid = jax.lax.dynamic_update_slice(cache["valid"], new_valid, (0, index))
        q_slot = index + jnp.arange(t)
        mask = (jnp.arange(s)[None, :] <= q_slot[:, None])[None] & valid[:, None, :]
        cos, sin = rope_cos_sin(
            jnp.asarray(positions), self.config.head_dim, self.config.rope_theta
        )
        x = self.model.embed_tokens(input_ids)

        def step(layer, h, k_c, v_c, i):
            return layer.with_cache(h, cos, sin, mask, new_valid, k_c, v_c, index, i)

        x, ks, vs, ys = run_layers_with_cache(
            self.model.layers, x, cache["k"], cache["v"], step, scanned=self.scanned
        )
        logits = self.logits_from_hidden(self.model.norm(x))
        return logits, {"k": ks, "v": vs, "valid": valid, "index": index + t}, ys
