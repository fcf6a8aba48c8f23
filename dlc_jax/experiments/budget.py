"""What a preset costs before it runs (``--dry-run``): load-independent CPU-seconds, fitted to
measured tiny-model runs (docs/experiments/README.md), turned into wall minutes on quiet cores."""

from __future__ import annotations

import dataclasses

TRAIN_FIXED_CPU_S = 12.0
TRAIN_CPU_S_PER_PROMPT_STEP = 0.105
EVAL_CPU_S = 18.0
SETUP_CPU_S = 120.0  # chain warm-up (80 CPU-s measured) + reference prefixes


@dataclasses.dataclass(frozen=True)
class Budget:
    runs: int
    trainings: int
    train_cpu_s: float
    eval_cpu_s: float
    workers: int

    @property
    def cpu_s(self) -> float:
        return SETUP_CPU_S + self.train_cpu_s + self.eval_cpu_s

    @property
    def wall_min(self) -> float:
        """Minutes on ``workers`` quiet cores (the evaluations overlap the trainings)."""
        return self.cpu_s / self.workers / 60.0

    def line(self) -> str:
        return (
            f"{self.runs} runs ({self.trainings} trainings; runs with identical configs share "
            f"one), about {self.cpu_s:,.0f} CPU-s: {self.train_cpu_s:,.0f} training + "
            f"{self.eval_cpu_s:,.0f} evaluation + {SETUP_CPU_S:.0f} set-up; about "
            f"{self.wall_min:.0f} min at --workers {self.workers} on quiet cores"
        )


def train_cpu_s(steps: int, batch_prompts: int) -> float:
    return TRAIN_FIXED_CPU_S + TRAIN_CPU_S_PER_PROMPT_STEP * steps * batch_prompts


def estimate(runs: int, trainings: int, steps: int, batch_prompts: int, workers: int) -> Budget:
    return Budget(
        runs=runs,
        trainings=trainings,
        train_cpu_s=trainings * train_cpu_s(steps, batch_prompts),
        eval_cpu_s=trainings * EVAL_CPU_S,
        workers=max(1, workers),
    )
