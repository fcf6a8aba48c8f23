"""The ``plan`` section of a training config (`dlc-jax plan` reads it; here because the trainer
must not import ``dlc_jax.plan``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """topology: the TPU slice (``v5p-16``, ``v5p:2x2x2``; '' = ``--topology`` required); slices:
    data parallel over DCN; efficiency: fraction of the bf16 peak of the old projected step time;
    libtpu_flags: TPU compiler flags (``--name=value ...``), the only key the trainer reads."""

    topology: str = ""
    slices: int = 1
    efficiency: float = 0.4
    libtpu_flags: str = ""

    def __post_init__(self):
        if self.slices < 1:
            raise ValueError(f"slices must be >= 1, got {self.slices}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency}")
        from dlc_jax.tpu_flags import parse

        parse(self.libtpu_flags)  # a token that is not --name[=value]: one-line ValueError
