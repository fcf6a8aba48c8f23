"""Decoder-layer stacks: remat policies, stacked (scanned) layers, and the layer loops. A scanned
model keeps one layer with parameters on a leading "layers" axis and runs it with `lax.scan` (one
compiled body); an unscanned one loops over an `nnx.List` in Python."""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx

from .config import REMAT_POLICIES

ATTN_OUT = "attn_out"  # checkpoint_name of each layer's attention output (save_attn_out policies)


def checkpoint_policy(name: str):
    """jax.checkpoint policy for a remat policy name (None = save nothing: full recompute)."""
    cp = jax.checkpoint_policies
    if name not in REMAT_POLICIES or name == "none":
        raise ValueError(f"remat policy must be one of {REMAT_POLICIES[1:]}, got {name!r}")
    return {
        "full": None,
        "save_dots": cp.dots_with_no_batch_dims_saveable,
        "save_attn_out": cp.save_only_these_names(ATTN_OUT),
        "save_dots_and_attn_out": cp.save_from_both_policies(
            cp.dots_with_no_batch_dims_saveable, cp.save_only_these_names(ATTN_OUT)
        ),
    }[name]


def resolve_remat(remat, config_policy: str) -> str:
    """Policy name from a constructor `remat` (None/False: the config's; True: the config's, or
    'full' when that is 'none'; a string: that policy)."""
    if isinstance(remat, str):
        if remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be a bool or one of {REMAT_POLICIES}, got {remat!r}")
        return remat
    return "full" if remat and config_policy == "none" else config_policy


def with_remat(fn: Callable, policy: str, *, in_scan: bool) -> Callable:
    """fn under jax.checkpoint with the named policy (CSE-protected outside a scan); 'none': fn."""
    if policy == "none":
        return fn
    return jax.checkpoint(fn, policy=checkpoint_policy(policy), prevent_cse=not in_scan)


def make_stacked(
    make_layer: Callable[[nnx.Rngs], nnx.Module], n: int, rngs: nnx.Rngs
) -> nnx.Module:
    """n layers built by make_layer as one module with parameters on a leading 'layers' axis."""

    @nnx.split_rngs(splits=n)
    @nnx.vmap(
        in_axes=(0,), out_axes=0, axis_size=n, transform_metadata={nnx.PARTITION_NAME: "layers"}
    )
    def build(r):
        return make_layer(r)

    return build(rngs)


def run_layers(layers, x, xs, step: Callable, *, scanned: bool, policy: str):
    """x through every layer: step(layer, x, xs_l) -> (x, ys_l). `layers` is the stacked module
    (scanned) or a sequence of modules; `xs` is a pytree of [L, ...] per-layer inputs (or None).
    Returns (x, ys stacked on a leading [L] axis; None when every ys_l is None)."""

    def body(state, h, x_l, graphdef):
        return step(nnx.merge(graphdef, state), h, x_l)

    if scanned:
        graphdef, state = nnx.split(layers)
        f = with_remat(lambda st, h, x_l: body(st, h, x_l, graphdef), policy, in_scan=True)
        return jax.lax.scan(lambda h, sx: f(sx[0], h, sx[1]), x, (state, xs))
    ys = []
    for i, layer in enumerate(layers):
        graphdef, state = nnx.split(layer)
        x_l = None if xs is None else jax.tree.map(lambda a, i=i: a[i], xs)
        fn = with_remat(lambda st, h, xl, g=graphdef: body(st, h, xl, g), policy, in_scan=False)
        x, y = fn(state, x, x_l)
        ys.append(y)
    return x, jax.tree.map(lambda *a: jax.numpy.stack(a), *ys)


def run_layers_with_cache(layers, x, k_cache, v_cache, step: Callable, *, scanned: bool):
    """KV-cache pass. step(layer, x, k, v, layer_index) -> (x, k, v, y); returns (x, k, v, ys on a
    leading [L] axis). Scanned: k/v_cache are [L, B, S, KV, hd] carried through the scan (step
    writes at `layer_index`); unscanned: tuples of [B, S, KV, hd] (layer_index None)."""
    if scanned:
        graphdef, state = nnx.split(layers)
        n = jax.tree.leaves(state)[0].shape[0]

        def body(carry, xs):  # carry: (x, k_cache, v_cache); xs: (layer state, layer index)
            *carry, y = step(nnx.merge(graphdef, xs[0]), *carry, xs[1])
            return tuple(carry), y

        carry, ys = jax.lax.scan(body, (x, k_cache, v_cache), (state, jax.numpy.arange(n)))
        return (*carry, ys)
    outs = []
    for layer, k_l, v_l in zip(layers, k_cache, v_cache, strict=True):
        x, *out = step(layer, x, k_l, v_l, None)
        outs.append(out)
    ks, vs, ys = zip(*outs)
    return x, ks, vs, jax.tree.map(lambda *a: jax.numpy.stack(a), *ys)
