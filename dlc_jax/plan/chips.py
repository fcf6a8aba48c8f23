"""Per-chip specs of TPU generations: Google's published HBM size, bf16 peak FLOP/s, HBM and
bidirectional ICI bandwidth (pages in ``source`` / ``bw_source``; v4's ICI figure is the pod's
all-reduce bandwidth per chip). ``hbm_usable_bytes``: what libtpu 0.0.42.1's compiler lets one
program use (from its ``RESOURCE_EXHAUSTED ... exceeds available HBM (X G)`` message)."""

from __future__ import annotations

import dataclasses

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """One TPU chip. ``libtpu_name``: the prefix of topology strings (``v5p:2x2x2``);
    ``chip_config``: libtpu's chip config (``megacore`` = one JAX device per chip on v4)."""

    generation: str
    libtpu_name: str
    device_kind: str
    hbm_published_bytes: int
    hbm_usable_bytes: int
    peak_bf16_flops: float
    dims: int  # torus dimensions of a slice: 3 (v4, v5p) or 2 (v5e, v6e)
    cores_in_type_name: bool  # GCP type names count TensorCores (v4-8 = 4 chips) instead of chips
    chip_config: str
    source: str
    hbm_bytes_per_s: float = 0.0
    ici_bytes_per_s: float = 0.0
    bw_source: str = ""


# per chip: (device_kind, published HBM, usable HBM, bf16 FLOP/s, torus dims, cores_in_type_name,
# chip_config, HBM bytes/s, ICI bytes/s)
_V4_ICI = 1.1e15 / 4096  # v4 publishes the pod's all-reduce bandwidth only
_TABLE = {
    "v4": ("TPU v4", 32 * GIB, int(30.75 * GIB), 275e12, 3, True, "megacore", 1200e9, _V4_ICI),
    "v5p": ("TPU v5", 95 * GIB, int(95.74 * GIB), 459e12, 3, True, "default", 2765e9, 1200e9),
    "v5e": ("TPU v5 lite", 16 * GIB, int(15.75 * GIB), 197e12, 2, False, "default", 819e9, 400e9),
    "v6e": ("TPU v6 lite", 32 * GIB, int(31.25 * GIB), 918e12, 2, False, "default", 1638e9, 800e9),
}
# the published figures, on https://cloud.google.com/tpu/docs/<generation>
_SOURCE = {
    "v4": "32 GiB HBM2, 275 TFLOP/s bf16 per chip",
    "v5p": "95 GB HBM2e, 459 TFLOP/s bf16 per chip",
    "v5e": "16 GB HBM2, 197 TFLOP/s bf16 per chip",
    "v6e": "32 GB HBM, 918 TFLOP/s bf16 per chip",
}
_BW_SOURCE = {
    "v4": "HBM2 1200 GBps; all-reduce bandwidth per Pod 1.1 PB/s over 4096 chips",
    "v5p": "HBM2e 2765 GBps; bidirectional ICI 1200 GBps per chip",
    "v5e": "HBM2 819 GBps; bidirectional ICI 400 GBps per chip",
    "v6e": "HBM 1638 GBps; bidirectional ICI 800 GBps per chip",
}


def _spec(gen: str, row: tuple) -> ChipSpec:
    page = f"https://cloud.google.com/tpu/docs/{gen}"
    *chip, hbm_bw, ici_bw = row
    args = (*chip, f"{page} ({_SOURCE[gen]})", hbm_bw, ici_bw, f"{page} ({_BW_SOURCE[gen]})")
    return ChipSpec(gen, gen, *args)


CHIPS: dict[str, ChipSpec] = {gen: _spec(gen, row) for gen, row in _TABLE.items()}

# GCP accelerator-type prefixes -> generation ("v5litepod-16" and "v5e-16" are the same slice)
TYPE_PREFIXES = {"v4": "v4", "v5p": "v5p", "v5litepod": "v5e", "v5e": "v5e", "v6e": "v6e"}


def chip(generation: str) -> ChipSpec:
    if generation not in CHIPS:
        raise ValueError(f"unknown TPU generation {generation!r} (known: {sorted(CHIPS)})")
    return CHIPS[generation]
