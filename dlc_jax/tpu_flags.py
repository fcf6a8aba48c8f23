"""The TPU compiler (libtpu) flags every TPU compile of this project runs with: `dlc-jax train` on a
TPU, the pod launchers (``launch/tpu_pod_train.sh``) and `dlc-jax plan`'s ahead-of-time compiles.

Why the plan sets them: which FSDP matmuls XLA turns into collective matmuls (windowed einsums,
which interleave the weight all-gather / gradient reduce-scatter with the matmul) is a libtpu
decision whose inputs are not all in the program. The same plan row (Qwen3-1.7B, 8 x 32,768 on
v5p-16) compiled on two machines with the same jax / libtpu gave 8.9 vs 25.0 GB of temporaries and
0.59 vs 0 of the layer matmuls windowed (issue 30); a compile whose flags are all stated gives one
answer, and the run on the pod compiles with the same ones. libtpu reads ``LIBTPU_INIT_ARGS`` once,
when JAX first loads the TPU backend, so :func:`apply` must run before that (before
``jax.devices()`` / ``jax.distributed.initialize`` / ``get_topology_desc``).

The set (``DEFAULT_FLAGS``) is MaxText's for FSDP training (its
``benchmarks/xla_flags_library.py``: ``CF_FOR_ALL_GATHER`` + ``DATA_PARALLEL_OVERLAP``):
asynchronous collective fusion of the FSDP all-gathers, overlapped with compute on the TensorCore;
the data-parallel all-reduce over DCN pipelined across iterations (multi-slice). The two
collective-matmul switches are stated *off* (libtpu's default is on). A windowed einsum over FSDP
weights, sharded along the contracted dimension, adds a partial product into the whole output once
per ring step: on the Qwen3-1.7B 8 x 4,096 v5p-16 plan the theta_s forward reads and writes each
[4,096, 6,144] MLP output 4 times per layer. With the switches off the loop-weighted HBM bytes per
chip fall 4.99e11 -> 2.22e11 (train step) and 1.75e11 -> 0.48e11 (theta_s forward) at the same
peak. The all-gathers stay asynchronous and overlap the previous layer's compute. MaxText's FSDP
set leaves them out and its tuned TPU sets turn them off. ``plan.libtpu_flags`` in the config adds
or overrides flags (``--name=value`` separated by spaces); flags already in the environment's
``LIBTPU_INIT_ARGS`` are kept only where neither names them.

This module imports nothing of the project or JAX (the trainer, below the plan, imports it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ENV = "LIBTPU_INIT_ARGS"

DEFAULT_FLAGS: tuple[str, ...] = (
    # MaxText CF_FOR_ALL_GATHER: async collective fusion of the FSDP all-gathers
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
    # MaxText DATA_PARALLEL_OVERLAP: the DCN all-reduce of multi-slice data parallelism
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
    "--xla_tpu_data_parallel_opt_different_sized_ops=true",
    # no collective matmuls (windowed einsums) for the FSDP all-gather / reduce-scatter: stated,
    # not left to the library's default (on)
    "--xla_tpu_enable_windowed_einsum_for_all_gather=false",
    "--xla_tpu_enable_windowed_einsum_for_reduce_scatter=false",
)


def parse(text: str) -> dict[str, str]:
    """``--a=1 --b`` -> {"--a": "--a=1", "--b": "--b"} (order kept; the last of a name wins).
    Raises ValueError naming a token that is not a ``--flag``."""
    out: dict[str, str] = {}
    for tok in text.split():
        if not tok.startswith("--") or len(tok) < 3:
            raise ValueError(f"libtpu flag {tok!r}: expected --name=value")
        out[tok.split("=", 1)[0]] = tok
    return out


def merged(extra: str = "", environ: MutableMapping[str, str] | None = None) -> str:
    """The ``LIBTPU_INIT_ARGS`` value: the environment's flags, then ``DEFAULT_FLAGS``, then
    ``extra`` (a later flag of the same name replaces an earlier one)."""
    env = os.environ if environ is None else environ
    flags = parse(env.get(ENV, ""))
    flags.update(parse(" ".join(DEFAULT_FLAGS)))
    flags.update(parse(extra))
    return " ".join(flags.values())


def lacks_defaults(args: str) -> bool:
    """Whether a recorded ``LIBTPU_INIT_ARGS`` value misses or changes any of ``DEFAULT_FLAGS``
    (a cached compile made with another flag set)."""
    have = parse(args)
    return any(have.get(name) != flag for name, flag in parse(" ".join(DEFAULT_FLAGS)).items())


def backend_loaded() -> bool:
    """Whether JAX has already loaded its backends (then libtpu has read its flags)."""
    xb = sys.modules.get("jax._src.xla_bridge")
    return bool(xb is not None and getattr(xb, "_backends", None))


def apply(extra: str = "", environ: MutableMapping[str, str] | None = None) -> str:
    """Set ``LIBTPU_INIT_ARGS`` to :func:`merged` and return it. Call before JAX loads the TPU
    backend; afterwards the value is still set (and returned) but this process's libtpu keeps
    the flags it started with."""
    env = os.environ if environ is None else environ
    value = merged(extra, env)
    env[ENV] = value
    return value


def main() -> int:
    """``python -m dlc_jax.tpu_flags [EXTRA]``: print the merged value (for shell launchers)."""
    print(merged(" ".join(sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
