"""MoE expert matmuls as megablox's Pallas grouped matmul (`gmm`) under `jax.shard_map` (GSPMD
cannot partition a Pallas call): y[t] = sum_k weights[t, k] * down(silu(x[t] @ wg[e]) * (x[t] @
wu[e])), e = experts[t, k]. Each device holds E / P experts (width split over `tensor` when it
divides, partial sums psum-ed); tokens split over `expert` reach their experts by all-gather +
psum_scatter or ragged_all_to_all (moe_a2a.py). Details: docs/MODEL.md, "Qwen3-MoE"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from .attention import mesh_platform
from .config import MOE_DISPATCHES, MOE_IMPLS, check_choice
from .moe_a2a import all_to_all_experts
from .sharding import logical_to_spec, spec_axes

TILE = 128  # the kernel's (m, k, n) tile, capped at each (padded) dimension


def resolve_moe_impl(impl: str, mesh: Mesh | None) -> str:
    """The implementation `impl` stands for: 'auto' is megablox on a TPU mesh, else ragged."""
    check_choice("moe_impl", impl, MOE_IMPLS)
    if impl != "auto":
        return impl
    return "megablox" if mesh_platform(mesh) == "tpu" else "ragged"


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def row_tile(m: int) -> int:
    """The row tile for m (token, expert) pairs: 128, or m rounded up to 8 when smaller."""
    return min(TILE, _round_up(max(m, 1), 8))


def _local_experts(
    x, experts, weights, wg, wu, wd, *, first_expert, num_experts: int, interpret: bool
):
    """One device's grouped matmuls. x [n, D], experts / weights [n, K] (global expert ids),
    wg / wu [El, D, I], wd [El, I, D] for experts [first_expert, first_expert + El) ->
    y [n, D]: the contribution of the local experts (other pairs contribute 0)."""
    from jax.experimental.pallas.ops.tpu.megablox.ops import gmm

    n, k = experts.shape
    n_local = wg.shape[0]
    m = n * k
    tm = row_tile(m)
    mp = _round_up(m, tm)
    flat = experts.reshape(-1).astype(jnp.int32)
    order = jnp.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    start = jnp.where(first_expert > 0, ends[first_expert - 1], 0)
    stop = ends[first_expert + n_local - 1]
    rows = jnp.arange(mp)
    local = ((rows >= start) & (rows < stop))[:, None]
    src = jnp.pad(order // k, (0, mp - m))
    xs = jnp.where(local, jnp.take(x, src, axis=0), 0)
    offset = jnp.asarray(first_expert, jnp.int32)
    # (m, k, n) tiles. The backward pass swaps k and n and puts m last, where a TPU block must be
    # a multiple of 128 or the whole dimension: hence 128 for k and n
    tiling = (row_tile(mp), TILE, TILE)

    def mm(lhs, rhs):  # gmm(lhs, rhs, group sizes, dtype, tiling, group offset, ..., interpret)
        return jnp.where(
            local, gmm(lhs, rhs, sizes, lhs.dtype, tiling, offset, None, False, interpret), 0
        )

    h = jnp.where(local, jax.nn.silu(mm(xs, wg)) * mm(xs, wu), 0)
    ys = mm(h, wd)[:m]
    out = jnp.zeros_like(ys).at[order].set(ys).reshape(n, k, -1)
    return jnp.sum(out * weights[..., None].astype(out.dtype), axis=1)


def _token_experts(x, experts, weights, wg, wu, wd, first_expert, num_experts, interpret):
    """`_local_experts` over x [..., D] with experts / weights [..., K], any leading shape."""
    flat = (a.reshape(-1, a.shape[-1]) for a in (x, experts, weights))
    kw = dict(first_expert=first_expert, num_experts=num_experts, interpret=interpret)
    return _local_experts(*flat, wg, wu, wd, **kw).reshape(x.shape)


def megablox_experts(
    x,
    experts,
    weights,
    wg,
    wu,
    wd,
    *,
    mesh: Mesh | None = None,
    rules=None,
    interpret=False,
    dispatch: str = "allgather",
):
    """x [B, T, D], experts [B, T, K] int, weights [B, T, K], wg / wu [E, D, I], wd [E, I, D] ->
    [B, T, D] in x's dtype. `dispatch`: 'allgather' | 'all_to_all'; with `interpret` (off TPU)
    the all-to-all runs as its all-gather emulation."""
    check_choice("moe_dispatch", dispatch, MOE_DISPATCHES)
    num_experts = wg.shape[0]
    if mesh is None or mesh.size == 1:
        return _token_experts(x, experts, weights, wg, wu, wd, 0, num_experts, interpret)
    xspec = logical_to_spec(("batch", "length", "act_embed"), x.shape, mesh, rules)
    tok = PartitionSpec(xspec[0], None, None)
    wspec = logical_to_spec(("exp", "embed", "moe_mlp"), wg.shape, mesh, rules)
    exp_axes, mlp_axes = spec_axes(wspec[0]), spec_axes(wspec[2])
    if len(exp_axes) > 1 or len(mlp_axes) > 1:
        raise ValueError(f"moe_impl='megablox' needs one mesh axis per expert dim, got {wspec}")
    expert_axis = exp_axes[0] if exp_axes else None
    tensor_axis = mlp_axes[0] if mlp_axes else None
    if tensor_axis in spec_axes(xspec[0]):  # tokens split over it already: keep the width whole
        tensor_axis = None
    up_spec = PartitionSpec(expert_axis, None, tensor_axis)
    down_spec = PartitionSpec(expert_axis, tensor_axis, None)
    # the expert axis when tokens are split over it too (else None)
    gather = expert_axis if expert_axis in spec_axes(xspec[0]) else None

    def body(x, experts, weights, wg, wu, wd):  # x [b, T, D], experts / weights [b, T, K]
        b, t, d = x.shape

        def local(xs, es, ws, first):  # this device's experts' share, summed over tensor
            y = _token_experts(xs, es, ws, wg, wu, wd, first, num_experts, interpret)
            return y if tensor_axis is None else jax.lax.psum(y, tensor_axis)

        if gather is not None and dispatch == "all_to_all":  # only to their experts' devices
            y = all_to_all_experts(
                *(a.reshape(-1, a.shape[-1]) for a in (x, experts, weights)),
                local,
                axis_name=gather,
                size=mesh.shape[gather],
                num_experts=num_experts,
                emulate=interpret,
            )
            return y.reshape(b, t, d)
        if gather is not None:  # see every peer's tokens
            x, experts, weights = (
                jax.lax.all_gather(a, gather, axis=0, tiled=True) for a in (x, experts, weights)
            )
        first = 0 if expert_axis is None else jax.lax.axis_index(expert_axis) * wg.shape[0]
        y = local(x, experts, weights, first)
        if gather is not None:
            y = jax.lax.psum_scatter(y, gather, scatter_dimension=0, tiled=True)
        elif expert_axis is not None:
            y = jax.lax.psum(y, expert_axis)
        return y.reshape(b, t, d)

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(tok, tok, tok, up_spec, up_spec, down_spec),
        out_specs=tok,
        check_vma=False,
    )(x, experts, weights, wg, wu, wd)
