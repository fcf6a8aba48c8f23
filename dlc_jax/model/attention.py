"""Causal grouped-query self-attention: query t sees key s when s <= t, `valid[b, s]` and both share
a segment id; padding queries' rows are unspecified. `impl`: dense (the reference) | xla | cudnn |
splash (Pallas TPU kernel under `shard_map`; interpreted off TPU) | auto (by the platform of the
mesh's devices, not `jax.default_backend()`). See docs/MODEL.md, "Attention"."""

from __future__ import annotations

import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from .config import ATTENTION_IMPLS, check_choice
from .sharding import logical_to_spec

_NEG = -1e30  # finite "minus infinity": fully masked rows give a uniform softmax, never NaN
_PAD_SEGMENT = np.iinfo(np.int32).min  # segment id of padding tokens inside the splash kernel
_SPLASH_BLOCKS = (512, 256, 128)  # largest one dividing the padded length is used


def mesh_platform(mesh: Mesh | None) -> str:
    """'tpu' | 'gpu' | 'cpu': platform of the mesh's devices (default backend without a mesh)."""
    if mesh is None:
        return jax.default_backend()
    plat = str(mesh.devices.flat[0].platform).lower()
    return "gpu" if plat in ("cuda", "rocm", "gpu") else plat


def resolve_impl(impl: str, mesh: Mesh | None, dtype=jnp.float32) -> str:
    """The concrete implementation `impl` ('auto' or one of ATTENTION_IMPLS) stands for."""
    check_choice("attention_impl", impl, ATTENTION_IMPLS)
    if impl != "auto":
        return impl
    plat = mesh_platform(mesh)
    if plat == "tpu":
        return "splash"
    if plat == "gpu":
        return "cudnn" if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else "xla"
    return "dense"


def causal_mask(valid, segment_ids=None):
    """[B, T, T] bool: key s <= query t, key valid, same segment (when segment_ids is given)."""
    t = valid.shape[1]
    mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid.astype(bool)[:, None, :]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    return mask


def dense_attention(q, k, v, mask):
    """Reference GQA. q [B,T,H,hd], k/v [B,S,KV,hd], mask [B,T,S] bool -> [B,T,H,hd]."""
    b, t, h, hd = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, h // kv, hd)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k).astype(jnp.float32) * (1.0 / math.sqrt(hd))
    s = jnp.where(mask[:, None, None, :, :], s, _NEG)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgts,bskd->btkgd", p, v)
    return o.reshape(b, t, h, hd)


def masked_attention(q, k, v, mask, impl: str = "xla"):
    """Attention under an explicit [B, T, S] bool mask (KV-cache decoding): dense, xla or cudnn."""
    if impl == "dense":
        return dense_attention(q, k, v, mask)
    kind: Literal["cudnn", "xla"] = "cudnn" if impl == "cudnn" else "xla"
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation=kind)


def self_attention(
    q, k, v, valid, segment_ids=None, *, impl: str = "auto", mesh: Mesh | None = None, rules=None
):
    """Causal GQA self-attention. q [B,T,H,hd], k/v [B,T,KV,hd], valid [B,T] (1 = real token),
    segment_ids [B,T] int or None -> [B,T,H,hd] in q's dtype. See the module doc for `impl`."""
    kind = resolve_impl(impl, mesh, q.dtype)
    valid = valid.astype(bool)
    if kind == "dense":
        return dense_attention(q, k, v, causal_mask(valid, segment_ids))
    if kind == "splash":
        seg = jnp.zeros(valid.shape, jnp.int32) if segment_ids is None else segment_ids
        seg = jnp.where(valid, seg.astype(jnp.int32), _PAD_SEGMENT)
        return splash_self_attention(
            q, k, v, seg, mesh=mesh, rules=rules, interpret=mesh_platform(mesh) != "tpu"
        )
    pad_seg = valid[:, None, :]
    if segment_ids is not None:
        pad_seg = pad_seg & (segment_ids[:, :, None] == segment_ids[:, None, :])
    if kind == "cudnn" and jnp.dtype(q.dtype) not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"attention_impl='cudnn' needs bf16/fp16 activations, got {q.dtype}")
    implementation: Literal["cudnn", "xla"] = "cudnn" if kind == "cudnn" else "xla"
    return jax.nn.dot_product_attention(
        q, k, v, mask=pad_seg[:, None], is_causal=True, implementation=implementation
    )


# ---- Splash (TPU) ----------------------------------------------------------------------------
@functools.cache
def _block_cached_causal_mask_class():
    """CausalMask with blocks cached by diagonal offset (built lazily: Pallas imports on use)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    class BlockCachedCausalMask(sm.CausalMask):
        """One shared read-only block per (q_start - kv_start, block shape): splash reads every
        block of the T x T mask on the host, and a causal block depends only on its diagonal
        offset (at 32k tokens ~130 distinct blocks instead of ~16k)."""

        def __init__(self, shape: tuple[int, int]):
            super().__init__(shape)
            self._blocks: dict[tuple[int, int, int], np.ndarray] = {}

        def __getitem__(self, idx) -> np.ndarray:
            q_slice, kv_slice = idx
            q0, q1, _ = q_slice.indices(self.shape[0])
            k0, k1, _ = kv_slice.indices(self.shape[1])
            key = (q0 - k0, q1 - q0, k1 - k0)
            block = self._blocks.get(key)
            if block is None:
                block = super().__getitem__(idx)
                block.flags.writeable = False
                self._blocks[key] = block
            return block

    return BlockCachedCausalMask


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, length: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    blk = next(b for b in _SPLASH_BLOCKS if length % b == 0)  # length: a multiple of 128
    blocks = ("q", "kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute", "q_dq", "kv_dq")
    kw: dict = {f"block_{b}": blk for b in blocks}
    sizes = sk.BlockSizes(**kw)
    mask = sm.MultiHeadMask([_block_cached_causal_mask_class()((length, length))] * heads)
    with jax.ensure_compile_time_eval():  # concrete mask tables, safe to cache across traces
        return sk.make_splash_mha(
            mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
        )


def _splash_local(q, k, v, seg, *, interpret: bool):
    """Per-device splash: q [b,T,h,hd], k/v [b,T,kv,hd], seg [b,T] int32 (T multiple of 128)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    kernel = _splash_kernel(q.shape[2], q.shape[1], interpret)
    scale = 1.0 / math.sqrt(q.shape[-1])
    qh = (q * jnp.asarray(scale, q.dtype)).transpose(0, 2, 1, 3)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def one(qr, kr, vr, sr):
        return kernel(qr, kr, vr, segment_ids=sk.SegmentIds(q=sr, kv=sr))

    return jax.vmap(one)(qh, kh, vh, seg).transpose(0, 2, 1, 3)


def _splash_specs(q_shape, kv_heads: int, mesh: Mesh, rules) -> tuple[PartitionSpec, PartitionSpec]:
    """(q/k/v spec, segment spec): batch as the rules shard it; heads only when H and KV divide."""
    b, t, h, hd = q_shape
    qspec = logical_to_spec(("batch", "length", "heads", "head_dim"), q_shape, mesh, rules)
    kspec = logical_to_spec(
        ("batch", "length", "kv_heads", "head_dim"), (b, t, kv_heads, hd), mesh, rules
    )
    heads = qspec[2] if qspec[2] == kspec[2] else None
    return PartitionSpec(qspec[0], None, heads, None), PartitionSpec(qspec[0], None)


def splash_self_attention(
    q, k, v, seg, *, mesh: Mesh | None = None, rules=None, interpret: bool = False
):
    """Causal splash attention with segment ids seg [B,T] (padding must carry its own id).
    T is padded to a multiple of 128 (padding gets _PAD_SEGMENT) and cut back afterwards."""
    t = q.shape[1]
    tp = max(128, -(-t // 128) * 128)
    if tp != t:
        widths = ((0, 0), (0, tp - t), (0, 0), (0, 0))
        q, k, v = jnp.pad(q, widths), jnp.pad(k, widths), jnp.pad(v, widths)
        seg = jnp.pad(seg, ((0, 0), (0, tp - t)), constant_values=_PAD_SEGMENT)
    local = functools.partial(_splash_local, interpret=interpret)
    if mesh is None or mesh.size == 1:
        out = local(q, k, v, seg)
    else:
        spec, seg_spec = _splash_specs(q.shape, k.shape[2], mesh, rules)
        out = jax.shard_map(
            local, mesh=mesh, in_specs=(spec, spec, spec, seg_spec), out_specs=spec, check_vma=False
        )(q, k, v, seg)
    return out[:, :t]
