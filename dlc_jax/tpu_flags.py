"""The libtpu flags every TPU compile of this project runs with (`dlc-jax train`, the pod launchers,
`dlc-jax plan`'s AOT compiles), stated rather than left to libtpu, whose choice of collective
matmuls varied between machines. libtpu reads ``LIBTPU_INIT_ARGS`` once, when JAX loads the TPU
backend: :func:`apply` must run before that. ``plan.libtpu_flags`` adds or overrides flags; the
environment's are kept where neither names them. Imports no JAX."""

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
    # no collective matmuls (windowed einsums, libtpu's default): over FSDP weights such a loop
    # rewrites the whole output once per ring step (2-4x the plan's HBM bytes)
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
    """Whether a recorded ``LIBTPU_INIT_ARGS`` value misses or changes any of ``DEFAULT_FLAGS``."""
    have = parse(args)
    return any(have.get(name) != flag for name, flag in parse(" ".join(DEFAULT_FLAGS)).items())


def backend_loaded() -> bool:
    """Whether JAX has already loaded its backends (then libtpu has read its flags)."""
    xb = sys.modules.get("jax._src.xla_bridge")
    return bool(xb is not None and getattr(xb, "_backends", None))


def apply(extra: str = "", environ: MutableMapping[str, str] | None = None) -> str:
    """Set ``LIBTPU_INIT_ARGS`` to :func:`merged` and return it (after JAX loaded the TPU backend,
    this process's libtpu keeps the flags it started with)."""
    env = os.environ if environ is None else environ
    env[ENV] = merged(extra, env)
    return env[ENV]


def main() -> int:
    """``python -m dlc_jax.tpu_flags [EXTRA]``: print the merged value (for shell launchers)."""
    print(merged(" ".join(sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
