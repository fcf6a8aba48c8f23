"""What a preset costs before it runs (``dlc-jax experiment --preset NAME --dry-run``).

CPU-seconds are load-independent (``os.wait4`` of each training process), so the estimate is
made in them and turned into wall minutes on quiet cores: the trainings run ``workers`` at a
time and each run's evaluation runs in the main process meanwhile. The per-run model is fitted
to measured runs of the tiny model (docs/experiments/README.md): a training costs about
``TRAIN_FIXED_CPU_S + TRAIN_CPU_S_PER_PROMPT_STEP * steps * batch_prompts`` (20 x 32: 69-94,
mean 79 CPU-s over the 104 runs of `tiny`; 40 x 32: 138-150 in the pilot), an evaluation about
``EVAL_CPU_S`` (14-38, mean 17 in `tiny`), the warm-up and reference prefixes once.
"""

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
        """Minutes on ``workers`` quiet cores: the CPU-seconds spread over the workers (the
        evaluations overlap the trainings)."""
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
