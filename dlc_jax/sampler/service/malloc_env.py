"""Environment of spawned samplers: glibc malloc on transparent huge pages (glibc >= 2.35), which
halves the CPU of the JAX backend's weight loads (page faults of each fresh parameter copy)."""

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
