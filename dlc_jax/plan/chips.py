"""Per-chip specs of TPU generations: HBM, published bf16 peak FLOP/s, HBM and ICI bandwidth.

``peak_bf16_flops``, ``hbm_published_bytes``, ``hbm_bytes_per_s`` and ``ici_bytes_per_s``
(bidirectional inter-chip bandwidth per chip; the roofline's ceilings) are Google's published
per-chip figures (pages in ``source`` / ``bw_source``; v4 gives no per-chip ICI figure: the pod's
all-reduce bandwidth per chip, 1.1 PB/s / 4,096 chips). ``hbm_usable_bytes`` is what the TPU
compiler in libtpu 0.0.42.1 lets one program use, measured by AOT-compiling a program with too
large temporaries and reading ``RESOURCE_EXHAUSTED ... exceeds available HBM (X G)``. A plan fits
when its peak is within the usable figure.
"""

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


CHIPS: dict[str, ChipSpec] = {
    "v4": ChipSpec(
        "v4",
        "v4",
        "TPU v4",
        32 * GIB,
        int(30.75 * GIB),
        275e12,
        3,
        True,
        "megacore",
        "https://cloud.google.com/tpu/docs/v4 (32 GiB HBM2, 275 TFLOP/s bf16 per chip)",
        hbm_bytes_per_s=1200e9,
        ici_bytes_per_s=1.1e15 / 4096,
        bw_source="https://cloud.google.com/tpu/docs/v4 "
        "(HBM2 1200 GBps; all-reduce bandwidth per Pod 1.1 PB/s over 4096 chips)",
    ),
    "v5p": ChipSpec(
        "v5p",
        "v5p",
        "TPU v5",
        95 * GIB,
        int(95.74 * GIB),
        459e12,
        3,
        True,
        "default",
        "https://cloud.google.com/tpu/docs/v5p (95 GB HBM2e, 459 TFLOP/s bf16 per chip)",
        hbm_bytes_per_s=2765e9,
        ici_bytes_per_s=1200e9,
        bw_source="https://cloud.google.com/tpu/docs/v5p "
        "(HBM2e 2765 GBps; bidirectional ICI 1200 GBps per chip)",
    ),
    "v5e": ChipSpec(
        "v5e",
        "v5e",
        "TPU v5 lite",
        16 * GIB,
        int(15.75 * GIB),
        197e12,
        2,
        False,
        "default",
        "https://cloud.google.com/tpu/docs/v5e (16 GB HBM2, 197 TFLOP/s bf16 per chip)",
        hbm_bytes_per_s=819e9,
        ici_bytes_per_s=400e9,
        bw_source="https://cloud.google.com/tpu/docs/v5e "
        "(HBM2 819 GBps; bidirectional ICI 400 GBps per chip)",
    ),
    "v6e": ChipSpec(
        "v6e",
        "v6e",
        "TPU v6 lite",
        32 * GIB,
        int(31.25 * GIB),
        918e12,
        2,
        False,
        "default",
        "https://cloud.google.com/tpu/docs/v6e (32 GB HBM, 918 TFLOP/s bf16 per chip)",
        hbm_bytes_per_s=1638e9,
        ici_bytes_per_s=800e9,
        bw_source="https://cloud.google.com/tpu/docs/v6e "
        "(HBM 1638 GBps; bidirectional ICI 800 GBps per chip)",
    ),
}

# GCP accelerator-type prefixes -> generation ("v5litepod-16" and "v5e-16" are the same slice)
TYPE_PREFIXES = {"v4": "v4", "v5p": "v5p", "v5litepod": "v5e", "v5e": "v5e", "v6e": "v6e"}


def chip(generation: str) -> ChipSpec:
    if generation not in CHIPS:
        raise ValueError(f"unknown TPU generation {generation!r} (known: {sorted(CHIPS)})")
    return CHIPS[generation]
