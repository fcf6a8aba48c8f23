"""The guard against non-finite steps: a step whose loss or gradient is NaN/Inf, or whose update
the jitted step refused, is undone (not applied, not pushed, counted in ``nonfinite_skipped``);
``train.max_nonfinite_steps`` such steps in a row stop the run (`NonFiniteTrainingError`)."""

from __future__ import annotations

import logging
import math

from dlc_jax.errors import UserError
from dlc_jax.trainer.state import TrainState

logger = logging.getLogger(__name__)


class NonFiniteTrainingError(UserError):
    """Too many consecutive steps with a non-finite loss or gradient."""


class NonFiniteGuard:
    """``limit``: ``train.max_nonfinite_steps``; ``counters``: the run's counters."""

    def __init__(self, limit: int, counters: dict[str, int]):
        self.limit = int(limit)
        self.counters = counters
        self.in_a_row = 0

    def check(
        self, state: TrainState, index: int, m: dict, before: tuple, applied: bool = True
    ) -> bool:
        """True when the step of batch ``index`` (metrics ``m``) is finite and applied; else the
        step is undone (``state`` back to ``before`` = (params, opt_state)) and False, or
        NonFiniteTrainingError at the limit."""
        loss, gnorm = m.get("loss/loss", 0.0), m.get("grad_norm", 0.0)
        if math.isfinite(loss) and math.isfinite(gnorm) and applied:
            self.in_a_row = 0
            return True
        state.params, state.opt_state = before
        self.counters["nonfinite_skipped"] += 1
        self.in_a_row += 1
        logger.warning(
            "step %d (batch %d): loss %s, grad_norm %s: non-finite loss, gradient or update; not "
            "applied, not pushed (%d in a row, stop at %d)",
            state.step + 1,
            index,
            loss,
            gnorm,
            self.in_a_row,
            self.limit,
        )
        if self.in_a_row >= self.limit:
            raise NonFiniteTrainingError(
                f"stopped: {self.limit} steps in a row had a non-finite loss or gradient (last: "
                f"loss {loss}, grad_norm {gnorm}); weights kept at step {state.step}. Check the "
                f"reward function and data for NaN/Inf, or lower optim.lr"
            )
        return False
