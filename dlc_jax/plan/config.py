"""The ``plan`` section of a training config (defined in `dlc_jax.trainer.plan_section`, next to
the other sections, so the trainer config does not import this package)."""

from dlc_jax.trainer.plan_section import PlanConfig

__all__ = ["PlanConfig"]
