"""XLA flags for the tests' own processes and the subprocesses they start.

XLA's CPU backend compiles at LLVM -O0 in tests: the test programs are tiny and each is compiled
once or twice, so compiling is most of what they cost (the compile-heavy integration files took
46% fewer CPU-seconds at -O0); results agree to float tolerance, and every process of one
comparison runs with the same flags. ``DLC_JAX_TEST_XLA_OPT=1`` keeps XLA's default optimization.
"""

from __future__ import annotations

import os

OPT = "" if os.environ.get("DLC_JAX_TEST_XLA_OPT") == "1" else "--xla_backend_optimization_level=0"


def xla_flags(devices: int | None = None) -> str:
    """``XLA_FLAGS`` for a process with ``devices`` fake CPU devices (None: the real one)."""
    return " ".join(
        f
        for f in (f"--xla_force_host_platform_device_count={devices}" if devices else "", OPT)
        if f
    )
