"""All-to-all token dispatch for expert parallelism (`moe_dispatch='all_to_all'`).

Inside the megablox `shard_map` body (moe_dispatch.py), each device sends every token only to the
devices holding at least one of its top-k experts (`need[j, t]`; capacity n * min(K, P) rows, the
expert ids and gate weights with it); the receiver lays source i's rows at row i * n (unused rows:
the sentinel expert E), runs its local experts (`_local_experts`) and returns one partial output per
row by the reverse exchange, which the source scatter-adds. Nothing is dropped; `dispatch_bytes`
counts the bytes against the all-gather path. `ragged_exchange` is the real `ragged_all_to_all` on
TPU and `emulated_ragged_all_to_all` (all_gather + masked row gathers, same semantics,
differentiable) elsewhere, so everything is tested on fake CPU devices. See docs/MODEL.md.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def emulated_ragged_all_to_all(
    operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name, size
):
    """`jax.lax.ragged_all_to_all`'s semantics (its docstring) from all_gather + masked gathers, for
    a mapped axis of static `size`: every device's slice `i` (for device i // (len / size)) of
    `operand[input_offsets[i]:+send_sizes[i]]` is written on that device at `output_offsets[i]`.
    `recv_sizes` is implied by the senders' sizes (kept for the same signature)."""
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


def ragged_exchange(*args, axis_name, size, emulate: bool):
    """The exchange primitive on `ragged_all_to_all`'s arguments (operand, output, input_offsets,
    send_sizes, output_offsets, recv_sizes): `jax.lax.ragged_all_to_all` (TPU), or its emulation
    (`emulate`)."""
    if emulate:
        return emulated_ragged_all_to_all(*args, axis_name=axis_name, size=size)
    return jax.lax.ragged_all_to_all(*args, axis_name=axis_name)


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
    first_expert)` -> [rows, D] the weighted sum of this device's E / size experts per row.
    Returns [n, D]: every token's full expert output (the module doc)."""
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

    def exchange(operand, output, *offsets_sizes):
        return ragged_exchange(
            operand, output, *offsets_sizes, axis_name=axis_name, size=size, emulate=emulate
        )

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
    """Bytes each device sends in one forward of one MoE layer over an expert axis of `devices`,
    for the routing `experts` [devices, n, K] (global ids; device i's n tokens), mean over devices.

    allgather: every token (D activations + K int32 ids + K weights) to every peer, then the
    reduce-scatter of [P * n, D] partial outputs (each device sends (P - 1) * n rows).
    all_to_all: each (token, other device holding one of its experts) row once, out and back.
    The backward pass moves the same again (the transposed collectives)."""
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
