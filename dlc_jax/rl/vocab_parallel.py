"""Token log-probs with the vocabulary split over the devices (Megatron-style vocab-parallel
log-softmax): no [positions, V] array crosses a device boundary.

``vocab_parallel_token_logprobs`` runs under ``shard_map`` over the mesh axes the positions are
split over (``rows``: the batch axes that divide the rows; ``positions``: further axes over each
row's positions; ``dlc_jax.model.sharding.logprob_axes``), n devices in all. Each device holds its
own positions, flattened, in chunks of ``ceil(chunk_size / n)``, and rows ``[i*V/n, (i+1)*V/n)``
of the unembedding (V zero-padded to a multiple of n; resharded once from the FSDP layout, one
all-to-all of the matrix).

Per chunk every device all-gathers the chunk's hidden rows (``chunk_size`` x D), computes local
f32 logits ``[chunk_size, V/n]``, and the devices combine per-position scalars: the max (``pmax``)
and the sums of exp, of the target and head logits and of the entropy term (``psum_scatter``: each
device receives its own positions' sums). The trainer (``trainer.step.policy_logprobs``) passes
``StepConfig.chunk_size x n``, so a device's logits block is the single-device path's, in n times
fewer iterations (each backward iteration re-reads and re-writes the [V/n, D] f32 gradient
accumulator). The backward pass accumulates each device's [V/n, D] share of the unembedding's
gradient (no collective in the loop) and reduce-scatters the hidden rows' gradient per chunk.

Numerics: log-prob and entropy are taken relative to the max m, as in ``rl.logprobs`` (no f32
cancellation of ``lse - sum(p * z)``); the hidden rows are gathered in the matmul's dtype
(``result_type(hidden, unembed)``), so the hidden gradient's partial sums are reduced in it.

Falls back to ``dlc_jax.rl.token_logprobs`` (whose chunks the SPMD partitioner splits along D,
all-reducing each chunk's [chunk_size, V] f32 logits) when top-k / top-p truncate (a sort over the
whole vocabulary), when ``vocab_chunk`` is set, or with no mesh or no axis to split positions over.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from dlc_jax.rl.logprobs import (
    OUT_OF_SUPPORT_LOGPROB,
    TokenLogprobs,
    map_chunks,
    target_ids,
    token_logprobs,
    truncates,
)


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


def _vocab_parallel_chunk(h, ids, w, *, axes, vocab, temperature, compute_entropy, floor):
    """One chunk on one device. h [c, D] its own positions, ids [c, 1+K], w [V/n, D] its vocab
    shard -> (log-probs [c, 1+K], entropy [c]) of its own positions."""
    h_all = jax.lax.all_gather(h, axes, axis=0, tiled=True)  # [n*c, D]: the chunk
    ids_all = jax.lax.all_gather(ids, axes, axis=0, tiled=True)
    vn = w.shape[0]
    start = jax.lax.axis_index(axes) * vn
    z = jnp.dot(h_all, w.T, preferred_element_type=jnp.float32) / jnp.float32(temperature)
    real = (start + jnp.arange(vn)) < vocab  # padded vocabulary rows take no part
    z = jnp.where(real[None, :], z, 0.0)  # finite everywhere: no inf * 0 in the backward pass
    # the shift cancels exactly in every output below: no gradient through it
    m_local = jnp.max(jnp.where(real[None, :], z, -jnp.inf), axis=-1)
    m = jax.lax.pmax(jax.lax.stop_gradient(m_local), axes)  # [n*c]
    zm = z - m[:, None]
    e = jnp.where(real[None, :], jnp.exp(zm), 0.0)
    local = ids_all - start
    mine = (local >= 0) & (local < vn) & (ids_all < vocab)
    zt = jnp.take_along_axis(zm, jnp.clip(local, 0, vn - 1), axis=-1)
    # per-position partial sums, each device receiving its own positions' totals
    parts = [jnp.sum(e, axis=-1, keepdims=True), jnp.where(mine, zt, 0.0)]
    if compute_entropy:
        parts.append(jnp.sum(e * zm, axis=-1, keepdims=True))
    sums = jax.lax.psum_scatter(
        jnp.concatenate(parts, axis=-1), axes, scatter_dimension=0, tiled=True
    )
    k1 = ids.shape[-1]
    log_s = jnp.log(sums[:, 0])
    in_range = (ids >= 0) & (ids < vocab)
    out = jnp.where(in_range, sums[:, 1 : 1 + k1] - log_s[:, None], jnp.float32(floor))
    ent = log_s - sums[:, 1 + k1] / sums[:, 0] if compute_entropy else jnp.zeros_like(log_s)
    return out, ent


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
    ``rows`` + ``positions`` (PartitionSpec entries: the axes hidden [B,T,D]'s rows and each row's
    positions are split over; see the module doc). ``vocab_axes``: the axes among those that split
    the vocabulary (default all; the trainer leaves out the data axis across slices, so the
    per-chunk collectives stay on ICI): each group of devices along them works on its own rows.
    ``chunk_size``: positions per chunk over the n devices of a group (each contributes
    ``ceil(chunk_size / n)`` of its own)."""
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
    chunk = functools.partial(
        _vocab_parallel_chunk,
        axes=vaxes,
        vocab=vocab,
        temperature=temperature,
        compute_entropy=compute_entropy,
        floor=out_of_support,
    )

    def local(h, w, ids):
        b, t, d = h.shape
        c = min(local_chunk_positions(chunk_size, n), b * t)
        out, ent = map_chunks(
            lambda hc, ic: chunk(hc, ic, w), h.reshape(b * t, d), ids.reshape(b * t, -1), c, dtype
        )
        return out.reshape(b, t, -1), ent.reshape(b, t)

    spec2, spec3 = PartitionSpec(rows, positions), PartitionSpec(rows, positions, None)
    out, ent = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec3, PartitionSpec(vaxes, None), spec3),
        out_specs=(spec3, spec2),
    )(hidden, w, ids)
    lp_head = out[..., 1:] if head_ids is not None else None
    return TokenLogprobs(lp=out[..., 0], lp_head=lp_head, entropy=ent)
