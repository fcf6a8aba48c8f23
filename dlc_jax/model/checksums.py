"""Two 32-bit sums of the bits of every array of a pytree, computed on device: what a checkpoint
records and verifies (`dlc_jax.trainer.checkpoint`) and what a LoRA base's fingerprint hashes
(`dlc_jax.lora.base_check`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _as_uint32(x):
    """The bits of ``x`` as uint32 (2- and 1-byte types widened; 8-byte types split in two)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = x.dtype.itemsize
    if size in (1, 2):
        u = jnp.uint8 if size == 1 else jnp.uint16
        return jax.lax.bitcast_convert_type(x, u).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(x, jnp.uint32)  # 8 bytes: a trailing axis of 2


def _leaf_digest(x):
    """(sum of bits*(2i+1), sum of rotl13(bits) ^ (i*golden), all finite) of one array, in
    wrapping uint32 arithmetic: order-free, so any sharding gives the same numbers."""
    bits = _as_uint32(x)
    idx = jnp.zeros(bits.shape, jnp.uint32)
    stride = 1
    for d in reversed(range(bits.ndim)):
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, bits.shape, d) * jnp.uint32(stride)
        stride *= bits.shape[d]
    h1 = jnp.sum(bits * (idx * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)
    rot = (bits << jnp.uint32(13)) | (bits >> jnp.uint32(19))
    h2 = jnp.sum(rot ^ (idx * jnp.uint32(0x9E3779B1)), dtype=jnp.uint32)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    finite = jnp.all(jnp.isfinite(x)) if floating else jnp.asarray(True)
    return h1, h2, finite


# One program per (shape, dtype, sharding), not per tree: a train state's structure changes as
# theta_s snapshots come and go, and each new structure would compile a whole-tree program again.
_digest_leaf = jax.jit(_leaf_digest)


def array_checksums(tree) -> tuple[dict[str, list[int]], list[str]]:
    """({array path: [h1, h2]}, [paths of float arrays holding NaN/Inf]) of a pytree of arrays."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    # one leaf at a time: many cross-device reductions in flight at once can miss XLA CPU's
    # collective rendezvous deadline (SIGABRT)
    digests = [jax.device_get(_digest_leaf(x)) for _, x in leaves]
    sums, bad = {}, []
    for (path, _), (h1, h2, finite) in zip(leaves, digests):
        key = jax.tree_util.keystr(path)
        sums[key] = [int(np.asarray(h1)), int(np.asarray(h2))]
        if not bool(np.asarray(finite)):
            bad.append(key)
    return sums, bad
