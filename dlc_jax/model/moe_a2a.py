"""All-to-all token dispatch for expert parallelism (`moe_dispatch='all_to_all'`): each device
sends a token (with its expert ids and gate weights) only to the devices holding one of its
experts; the receiver puts source i's rows at row i * n (unused rows: sentinel expert E), runs its
local experts and sends partial outputs back, which the source scatter-adds. Nothing is dropped.
Off TPU, `emulated_ragged_all_to_all` stands in for `ragged_all_to_all`. See docs/MODEL.md."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def emulated_ragged_all_to_all(
    operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name, size
):
    """`jax.lax.ragged_all_to_all`'s semantics from all_gather + masked gathers (differentiable),
    for a mapped axis of static `size`. `recv_sizes` is implied (kept for the same signature)."""
    del recv_sizes
    me = jax.lax.axis_index(axis_name)
    per = input_offsets.shape[0] // size  # slices per destination device
    ops = jax.lax.all_gather(operand, axis_name)  # [P, N, ...]
    in_off, sizes, out_off = (
        jax.lax.all_gather(a, axis_name) for a in (input_offsets, send_sizes, output_offsets)
    )
    rows = jnp.arange(output.shape[0])
    n_in = operand.shape[0]
    bshape = (-1,) + (1,) * (output.ndim - 1)
    result = output
    for src in range(size):
        for s in range(per):
            i = me * per + s
            o, z, i0 = out_off[src, i], sizes[src, i], in_off[src, i]
            hit = (rows >= o) & (rows < o + z)
            vals = jnp.take(ops[src], jnp.clip(i0 + rows - o, 0, n_in - 1), axis=0)
            result = jnp.where(hit.reshape(bshape), vals, result)
    return result


def all_to_all_experts(
    x,
    experts,
    weights,
    local_fn: Callable,
    *,
    axis_name: str,
    size: int,
    num_experts: int,
    emulate: bool,
):
    """x [n, D], experts / weights [n, K] (this device's tokens); `local_fn(x, experts, weights,
    first_expert)` -> [rows, D] from this device's experts. Returns every token's output [n, D]."""
    n, k = experts.shape
    d = x.shape[-1]
    n_local = num_experts // size
    me = jax.lax.axis_index(axis_name)
    dev = experts.astype(jnp.int32) // n_local  # [n, K] device of each chosen expert
    need = jnp.any(dev[None, :, :] == jnp.arange(size)[:, None, None], axis=-1)  # [P, n]
    send_sizes = jnp.sum(need, axis=1).astype(jnp.int32)
    input_offsets = (jnp.cumsum(send_sizes) - send_sizes).astype(jnp.int32)
    cap = n * min(k, size)
    order = jnp.argsort(~need.reshape(-1), stable=True)[:cap]  # needed rows first, device-major
    tok = order % n
    output_offsets = jnp.full((size,), me * n, jnp.int32)  # source i's rows at i * n
    recv_sizes = jax.lax.all_to_all(send_sizes, axis_name, 0, 0, tiled=True)

    def exchange(*args):  # `jax.lax.ragged_all_to_all(*args)`, or its emulation
        if emulate:
            return emulated_ragged_all_to_all(*args, axis_name=axis_name, size=size)
        return jax.lax.ragged_all_to_all(*args, axis_name=axis_name)

    fwd = (input_offsets, send_sizes, output_offsets, recv_sizes)
    m = size * n
    rx = exchange(jnp.take(x, tok, axis=0), jnp.zeros((m, d), x.dtype), *fwd)
    re = exchange(
        jnp.take(experts.astype(jnp.int32), tok, axis=0),
        jnp.full((m, k), num_experts, jnp.int32),  # sentinel: no expert
        *fwd,
    )
    rw = exchange(jnp.take(weights, tok, axis=0), jnp.zeros((m, k), weights.dtype), *fwd)
    y = local_fn(rx, re, rw, me * n_local)  # [m, D]
    back = (
        jnp.arange(size, dtype=jnp.int32) * n,
        recv_sizes,
        jax.lax.all_to_all(input_offsets, axis_name, 0, 0, tiled=True),
        send_sizes,
    )
    ys = exchange(y, jnp.zeros((cap, d), y.dtype), *back)
    sent = (jnp.arange(cap) < jnp.sum(send_sizes))[:, None]
    return jnp.zeros((n, d), ys.dtype).at[tok].add(jnp.where(sent, ys, 0))


def dispatch_bytes(
    experts, *, devices: int, num_experts: int, hidden: int, act_bytes: int = 2
) -> dict[str, float]:
    """Mean bytes a device sends in one MoE layer's forward over an expert axis of `devices`, for
    routing `experts` [devices, n, K]. allgather: every token to every peer, then the
    reduce-scatter of partial outputs; all_to_all: each (token, remote expert device) row out
    and back. The backward pass moves the same again."""
    e = np.asarray(experts)
    p, n, k = e.shape
    row_out = hidden * act_bytes + k * (4 + act_bytes)
    dev = e // (num_experts // devices)
    need = (dev[:, None, :, :] == np.arange(p)[None, :, None, None]).any(-1)  # [src, dst, n]
    remote = sum(int(need[s, j].sum()) for s in range(p) for j in range(p) if j != s) / p
    allgather = (p - 1) * n * (row_out + hidden * act_bytes)
    a2a = remote * (row_out + hidden * act_bytes)
    return {
        "allgather": float(allgather),
        "all_to_all": float(a2a),
        "ratio": a2a / allgather if allgather else 0.0,
        "remote_rows_per_device": remote,
    }
