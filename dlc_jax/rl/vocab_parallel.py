"""Token log-probs with the vocabulary split over the devices (Megatron-style vocab-parallel
log-softmax): no [positions, V] array crosses a device boundary.

Under ``shard_map`` over the axes the positions are split over (``rows``, ``positions``: see
``dlc_jax.model.sharding.logprob_axes``), n devices in all, each device takes its positions in
chunks of ``ceil(chunk_size / n)`` and holds unembedding rows ``[i*V/n, (i+1)*V/n)`` (V zero-padded
to a multiple of n). Per chunk it all-gathers the hidden rows (in the matmul's dtype), computes f32
logits ``[chunk_size, V/n]`` and combines per-position scalars (``pmax`` of the max,
``psum_scatter`` of the sums of exp, of the picked logits and of the entropy term), relative to the
max as in ``rl.logprobs``. The backward pass (``jax.custom_vjp``; the forward saves the max, log S
and the entropy per position) recomputes each chunk's logits once and forms ``dz = sum_k g_k [v =
id_k] - p_v (sum_k g_k + g_H (z_v - log Z + H))`` in one pass: half the HBM traffic of autodiff's
(docs/bench/PLAN.md). Falls back to ``token_logprobs`` when top-k / top-p truncate (a sort over the
whole vocabulary), with ``vocab_chunk``, or with no mesh or no axis to split positions over."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from dlc_jax.rl.logprobs import (
    OUT_OF_SUPPORT_LOGPROB,
    TokenLogprobs,
    target_ids,
    token_logprobs,
    truncates,
)

# recorded in plan JSONs (``logprob_backward``)
BACKWARD = "custom-vjp"


def axis_names(entry) -> tuple[str, ...]:
    """The mesh axis names of a PartitionSpec entry (None, a name or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def vocab_shards(mesh, rows, positions=None, vocab_axes=None) -> int:
    """n: the devices the vocabulary is split over for PartitionSpec entries ``rows`` and
    ``positions`` (``vocab_axes``: a subset of their axes; 1 without a mesh)."""
    if mesh is None:
        return 1
    axes = axis_names(rows) + axis_names(positions) if vocab_axes is None else tuple(vocab_axes)
    return math.prod(mesh.shape[a] for a in axes)


def local_chunk_positions(chunk_size: int, shards: int) -> int:
    """Positions one device contributes to a chunk of ``chunk_size`` split over ``shards``."""
    return max(1, -(-chunk_size // shards))


class _Spec(NamedTuple):
    """The static settings of one vocab-parallel log-prob map (hashable: custom_vjp's nondiff)."""

    axes: tuple[str, ...]  # the vocabulary's axes
    others: tuple[str, ...]  # the other axes the positions are split over (w is the same on them)
    vocab: int
    temperature: float
    compute_entropy: bool
    floor: float
    chunk: int  # positions per device per chunk
    unpadded: bool  # V is a multiple of n: no padded vocabulary rows to mask


def _logits(h_all, w, s: _Spec):
    """f32 logits [n*c, V/n] of the chunk's positions on this device's vocab rows, and the rows'
    vocabulary ids [V/n] (padded rows, when V is not a multiple of n, have ids >= V)."""
    ids = jax.lax.axis_index(s.axes) * w.shape[0] + jnp.arange(w.shape[0])
    z = jnp.dot(h_all, w.T, preferred_element_type=jnp.float32) / jnp.float32(s.temperature)
    return z, ids


def _real(x, vocab_ids, s: _Spec, fill: float):
    """x [n*c, V/n] with ``fill`` on the padded vocabulary rows (x itself when none is padded)."""
    return x if s.unpadded else jnp.where(vocab_ids[None, :] < s.vocab, x, fill)


def _picked(x, vocab_ids, ids_all, weights=None):
    """sum_v x[p, v] [v = ids_all[p, k]] (times weights[p, k]) -> [n*c, 1+K]: a comparison that
    fuses with the other per-position reductions (a gather reads its own copy of the logits)."""
    hit = vocab_ids[None, :, None] == ids_all[:, None, :]
    val = x[:, :, None] if weights is None else weights[:, None, :]
    out = jnp.where(hit, val, 0.0)
    return jnp.sum(out, axis=1) if weights is None else jnp.sum(out, axis=2)


def _chunk_forward(h, ids, w, s: _Spec):
    """One chunk on one device. h [c, D] its own positions, ids [c, 1+K], w [V/n, D] its vocab
    shard -> (log-probs [c, 1+K], entropy [c], max [n*c], log S [c])."""
    h_all = jax.lax.all_gather(h, s.axes, axis=0, tiled=True)  # [n*c, D]: the chunk
    ids_all = jax.lax.all_gather(ids, s.axes, axis=0, tiled=True)
    z, vocab_ids = _logits(h_all, w, s)
    m = jax.lax.pmax(jnp.max(_real(z, vocab_ids, s, -jnp.inf), axis=-1), s.axes)  # [n*c]
    zm = z - m[:, None]
    e = _real(jnp.exp(zm), vocab_ids, s, 0.0)
    # per-position partial sums, each device receiving its own positions' totals
    parts = [jnp.sum(e, axis=-1, keepdims=True), _picked(zm, vocab_ids, ids_all)]
    if s.compute_entropy:
        parts.append(jnp.sum(e * _real(zm, vocab_ids, s, 0.0), axis=-1, keepdims=True))
    sums = jax.lax.psum_scatter(
        jnp.concatenate(parts, axis=-1), s.axes, scatter_dimension=0, tiled=True
    )
    k1 = ids.shape[-1]
    log_s = jnp.log(sums[:, 0])
    in_range = (ids >= 0) & (ids < s.vocab)
    out = jnp.where(in_range, sums[:, 1 : 1 + k1] - log_s[:, None], jnp.float32(s.floor))
    ent = log_s - sums[:, 1 + k1] / sums[:, 0] if s.compute_entropy else jnp.zeros_like(log_s)
    return out, ent, m, log_s


def _chunk_backward(h, ids, w, m, log_s, ent, g_out, g_ent, s: _Spec):
    """The cotangents of one chunk: (hidden [c, D] of this device's positions, its vocab shard's
    unembedding share [V/n, D] f32); ``dz`` as in the module doc."""
    gather = functools.partial(jax.lax.all_gather, axis_name=s.axes, axis=0, tiled=True)
    h_all, ids_all = gather(h), gather(ids)
    in_range = (ids_all >= 0) & (ids_all < s.vocab)
    g_all = jnp.where(in_range, gather(g_out), 0.0)  # the floor has no gradient
    per_pos = gather(jnp.stack([log_s, ent, g_ent], axis=-1))  # [n*c, 3]
    z, vocab_ids = _logits(h_all, w, s)
    zm = z - m[:, None]
    p = _real(jnp.exp(zm - per_pos[:, 0:1]), vocab_ids, s, 0.0)
    coef = jnp.sum(g_all, axis=-1, keepdims=True)
    if s.compute_entropy:  # dH/dz_v = -p_v (z_v - log Z + H), relative to the max m
        coef = coef + per_pos[:, 2:3] * (zm - (per_pos[:, 0:1] - per_pos[:, 1:2]))
    dz = (_picked(None, vocab_ids, ids_all, g_all) - p * coef) / jnp.float32(s.temperature)
    dz = dz.astype(h_all.dtype)
    dh_all = jnp.dot(dz, w, preferred_element_type=jnp.float32).astype(h.dtype)
    dh = jax.lax.psum_scatter(dh_all, s.axes, scatter_dimension=0, tiled=True)
    return dh, jnp.dot(dz.T, h_all, preferred_element_type=jnp.float32)


def _chunked(x, s: _Spec):
    return x.reshape(x.shape[0] // s.chunk, s.chunk, *x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _vocab_parallel_map(s: _Spec, h, w, ids):
    """h [N, D] (N a multiple of s.chunk), w [V/n, D], ids [N, 1+K] on one device -> (log-probs
    [N, 1+K], entropy [N]); the backward pass recomputes each chunk's logits once."""
    return _map_forward(s, h, w, ids)[0]


def _map_forward(s: _Spec, h, w, ids):
    out, ent, m, log_s = jax.lax.map(
        lambda x: _chunk_forward(x[0], x[1], w, s), (_chunked(h, s), _chunked(ids, s))
    )
    outs = (out.reshape(h.shape[0], -1), ent.reshape(h.shape[0]))
    return outs, (h, w, ids, m, log_s, ent)


def _map_backward(s: _Spec, res, cts):
    h, w, ids, m, log_s, ent = res
    g_out, g_ent = cts

    def body(dw, x):
        dh, dw_c = _chunk_backward(*x[:2], w, *x[2:], s=s)
        return dw + dw_c, dh

    xs = (_chunked(h, s), _chunked(ids, s), m, log_s, ent, _chunked(g_out, s), _chunked(g_ent, s))
    dw0 = jnp.zeros_like(w, jnp.float32)
    dw0 = jax.lax.pcast(dw0, s.others, to="varying") if s.others else dw0
    dw, dh = jax.lax.scan(body, dw0, xs)
    dw = jax.lax.psum(dw, s.others) if s.others else dw  # w's share from every group of rows
    return dh.reshape(h.shape), dw.astype(w.dtype), None


_vocab_parallel_map.defvjp(_map_forward, _map_backward)


def vocab_parallel_token_logprobs(
    hidden: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    *,
    mesh,
    rows,
    positions=None,
    vocab_axes: tuple[str, ...] | None = None,
    head_ids: jax.Array | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_size: int = 256,
    vocab_chunk: int | None = None,
    compute_entropy: bool = True,
    out_of_support: float = OUT_OF_SUPPORT_LOGPROB,
) -> TokenLogprobs:
    """``token_logprobs`` (same arguments and outputs) with the vocabulary split over the mesh axes
    ``rows`` + ``positions`` (PartitionSpec entries of hidden [B,T,D]'s rows and positions).
    ``vocab_axes``: the subset of those that split the vocabulary (default all); each group of
    devices along them works on its own rows. ``chunk_size``: positions per chunk over a group."""
    axes = axis_names(rows) + axis_names(positions)
    vaxes = axes if vocab_axes is None else tuple(a for a in axes if a in vocab_axes)
    vocab = unembed.shape[0]
    kw = dict(
        head_ids=head_ids,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        chunk_size=chunk_size,
        vocab_chunk=vocab_chunk,
        compute_entropy=compute_entropy,
        out_of_support=out_of_support,
    )
    if mesh is None or not vaxes or truncates(vocab, top_k, top_p) or vocab_chunk is not None:
        return token_logprobs(hidden, unembed, targets, **kw)  # type: ignore[arg-type]
    ids = target_ids(
        hidden, unembed, targets, head_ids, temperature, top_k, top_p, chunk_size, vocab_chunk
    )
    n = vocab_shards(mesh, rows, positions, vaxes)
    vn = -(-vocab // n)
    w = jnp.pad(unembed, ((0, vn * n - vocab), (0, 0))) if vn * n != vocab else unembed
    dtype = jnp.result_type(hidden.dtype, unembed.dtype)  # what jnp.dot would multiply in
    others = tuple(a for a in axes if a not in vaxes)
    settings = (vaxes, others, vocab, float(temperature), compute_entropy, out_of_support)

    def local(h, w, ids):
        b, t, d = h.shape
        c = min(local_chunk_positions(chunk_size, n), b * t)
        spec = _Spec(*settings, c, vn * n == vocab)  # positions per chunk, V a multiple of n
        pad = -(b * t) % c
        hf = jnp.pad(h.reshape(b * t, d).astype(dtype), ((0, pad), (0, 0)))
        idf = jnp.pad(ids.reshape(b * t, -1), ((0, pad), (0, 0)))
        out, ent = _vocab_parallel_map(spec, hf, w, idf)
        return out[: b * t].reshape(b, t, -1), ent[: b * t].reshape(b, t)

    spec2, spec3 = PartitionSpec(rows, positions), PartitionSpec(rows, positions, None)
    out, ent = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec3, PartitionSpec(vaxes, None), spec3),
        out_specs=(spec3, spec2),
    )(hidden, w, ids)
    lp_head = out[..., 1:] if head_ids is not None else None
    return TokenLogprobs(lp=out[..., 0], lp_head=lp_head, entropy=ent)
