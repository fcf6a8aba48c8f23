"""The environment a sampler process is started with: glibc's malloc backs its large blocks with
transparent huge pages (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, glibc >= 2.35; ignored by older
ones and other C libraries).

Why: a weight push makes the JAX engine allocate a fresh copy of every parameter (the old weights
serve until the swap), and each first-touched 4 KiB page is a kernel page fault. With huge pages
the JAX backend's load of a bf16 push took about half the CPU per GB on the 2-core development VM
(`dlc_jax/bench/weight_sync_stages.py`: ~1.1 -> ~0.5-0.7 CPU-s/GB). A tunable the caller already
set (``glibc.malloc.hugetlb=0`` to opt out) is left alone. Glibc reads it only at process start,
so it is set for the processes this package starts (`process.SamplerProcess`, the benches); a
sampler started by hand gets it from its own environment.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

HUGETLB = "glibc.malloc.hugetlb=1"


def with_huge_pages(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with `HUGETLB` added to GLIBC_TUNABLES (Linux; unless the caller set hugetlb)."""
    out = dict(env)
    current = out.get("GLIBC_TUNABLES", "")
    if not sys.platform.startswith("linux") or "glibc.malloc.hugetlb" in current:
        return out
    out["GLIBC_TUNABLES"] = f"{current}:{HUGETLB}" if current else HUGETLB
    return out
