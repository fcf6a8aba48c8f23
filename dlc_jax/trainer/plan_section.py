"""The ``plan`` section of a training config: where ``dlc-jax plan`` checks the run by default.

Defined with the trainer's config sections (the trainer config holds it, and must not import the
``plan`` package above it); ``dlc_jax.plan.config.PlanConfig`` is this class."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """topology: the TPU slice the config is meant for (GCP type ``v5p-16`` or ``v5p:2x2x2``; '' =
    none, ``--topology`` is then required); slices: how many of them (data parallel over DCN);
    efficiency: fraction of the chip's bf16 peak assumed for the projected step time. The trainer
    ignores this section."""

    topology: str = ""
    slices: int = 1
    efficiency: float = 0.4

    def __post_init__(self):
        if self.slices < 1:
            raise ValueError(f"slices must be >= 1, got {self.slices}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency}")
