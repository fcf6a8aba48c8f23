"""Token log-probs with the vocabulary split over the devices (Megatron-style vocab-parallel
log-softmax): no [positions, V] array crosses a device boundary.

``vocab_parallel_token_logprobs`` runs under ``shard_map`` over the mesh axes the positions are
split over (``rows``: the batch axes that divide the rows; ``positions``: further axes over each
row's positions; ``dlc_jax.model.sharding.logprob_axes``), n devices in all. Each device holds:

* its own positions of the batch, flattened, in chunks of ``ceil(chunk_size / n)`` positions;
* rows ``[i*V/n, (i+1)*V/n)`` of the unembedding (V zero-padded to a multiple of n), resharded once
  before the chunk loop from the FSDP layout (split along D): one all-to-all of the matrix, not a
  gather of it.

Per chunk, every device all-gathers the chunk's hidden rows (``chunk_size`` x D, small), computes
local f32 logits ``[chunk_size, V/n]``, and the devices combine per-position scalars: the max
(``pmax``), the sum of exp, the target and head logits and the entropy term (``psum_scatter``: each
device receives its own positions' sums). So ``chunk_size`` keeps its meaning, positions per chunk
(over the n devices), and a device's logits chunk is ``chunk_size x V/n`` f32. The trainer
(``trainer.step.policy_logprobs``) passes ``StepConfig.chunk_size x n``: each device's logits
block is then ``StepConfig.chunk_size x V`` f32, what one device holds on the single-device
path, in n times fewer loop iterations (each iteration of the backward loop re-reads and
re-writes the [V/n, D] f32 gradient accumulator, so fewer, larger chunks move fewer bytes).
In the backward pass each device accumulates only its [V/n, D] share of the unembedding's
gradient (no collective in the loop, no full-size gradient per device) and the hidden rows'
gradient is reduce-scattered back to their owners per chunk ([chunk_size, D]).

Numerics: the log-prob is ``(z_t - m) - log(sum exp(z - m))`` and the entropy
``log S - sum(e * (z - m)) / S`` with ``e = exp(z - m)``, ``S = sum e``: both relative to the max m,
so no large ``lse`` and ``E[z]`` are subtracted (the f32 cancellation of ``lse - sum(p * z)``). The
hidden rows are gathered in the matmul's dtype (``result_type(hidden, unembed)``, as ``jnp.dot``
promotes them), so the hidden gradient's partial sums are reduced in that dtype.

Falls back to ``dlc_jax.rl.token_logprobs`` (flattened contiguous chunks; the SPMD partitioner
all-reduces each chunk's [chunk_size, V] f32 logits when the unembedding is split along D) when
top-k / top-p truncate (they need a sort over the whole vocabulary), when ``vocab_chunk`` is set,
or when there is no mesh or no axis to split the positions over.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from dlc_jax.rl.logprobs import OUT_OF_SUPPORT_LOGPROB, TokenLogprobs, token_logprobs
from dlc_jax.rl.sampling import check_sampling_params


def axis_names(entry) -> tuple[str, ...]:
    """The mesh axis names of a PartitionSpec entry (None, a name or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def truncates(vocab: int, top_k: int, top_p: float) -> bool:
    """Whether top-k / top-p remove tokens (they need a sort over the whole vocabulary: the
    vocab-parallel path then falls back to ``token_logprobs``)."""
    return (0 < top_k < vocab) or top_p < 1.0


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
    if compute_entropy:
        ent = log_s - sums[:, 1 + k1] / sums[:, 0]
    else:
        ent = jnp.zeros_like(log_s)
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
    check_sampling_params(temperature, top_k, top_p, vocab)
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
    if hidden.ndim != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(
            f"hidden must be [B,T,D] and targets [B,T]: {hidden.shape}, {targets.shape}"
        )
    if unembed.ndim != 2 or unembed.shape[1] != hidden.shape[2]:
        raise ValueError(f"unembed must be [V,{hidden.shape[2]}], got {unembed.shape}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n = vocab_shards(mesh, rows, positions, vaxes)
    vn = -(-vocab // n)
    w = jnp.pad(unembed, ((0, vn * n - vocab), (0, 0))) if vn * n != vocab else unembed
    ids = targets[..., None].astype(jnp.int32)
    if head_ids is not None:
        ids = jnp.concatenate([ids, head_ids.astype(jnp.int32)], axis=-1)
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
        flat = b * t
        c = min(local_chunk_positions(chunk_size, n), flat)
        n_chunks = -(-flat // c)
        pad = n_chunks * c - flat
        hf = jnp.pad(h.reshape(flat, d), ((0, pad), (0, 0))).astype(dtype)
        idf = jnp.pad(ids.reshape(flat, -1), ((0, pad), (0, 0)))
        xs = (hf.reshape(n_chunks, c, d), idf.reshape(n_chunks, c, -1))
        out, ent = jax.lax.map(jax.checkpoint(lambda x: chunk(x[0], x[1], w)), xs)
        out = out.reshape(n_chunks * c, -1)[:flat].reshape(b, t, -1)
        return out, ent.reshape(n_chunks * c)[:flat].reshape(b, t)

    spec2, spec3 = PartitionSpec(rows, positions), PartitionSpec(rows, positions, None)
    out, ent = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec3, PartitionSpec(vaxes, None), spec3),
        out_specs=(spec3, spec2),
    )(hidden, w, ids)
    lp_head = out[..., 1:] if head_ids is not None else None
    return TokenLogprobs(lp=out[..., 0], lp_head=lp_head, entropy=ent)
