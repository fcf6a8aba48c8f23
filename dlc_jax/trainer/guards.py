"""What stops a run safely: `NonFiniteGuard` (non-finite steps undone, too many in a row stop the
run) and `SigintLatch` (a Ctrl-C recorded, so one swallowed by a callback still stops the run).
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
from collections.abc import Callable

from dlc_jax.errors import UserError
from dlc_jax.trainer.state import TrainState, update_count

logger = logging.getLogger(__name__)


class NonFiniteTrainingError(UserError):
    """Too many consecutive steps with a non-finite loss or gradient."""


class NonFiniteGuard:
    """``limit``: ``train.max_nonfinite_steps``; ``counters``: the run's counters."""

    def __init__(self, limit: int, counters: dict[str, int]):
        self.limit = int(limit)
        self.counters = counters
        self.in_a_row = 0

    def check(self, state: TrainState, index: int, m: dict, before: tuple) -> bool:
        """True when the step of batch ``index`` is finite and applied (the optimizer counted it);
        else False with ``state`` back to ``before`` = (params, opt_state), or
        NonFiniteTrainingError at the limit."""
        loss, gnorm = m.get("loss/loss", 0.0), m.get("grad_norm", 0.0)
        applied = update_count(state.opt_state) != update_count(before[1])
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


class SigintLatch:
    """`install` sets a SIGINT handler that records the interrupt (``caught``) and raises
    KeyboardInterrupt (main thread only); `restore` puts the previous handler back. A recorded
    interrupt raised inside a callback (JAX's gc callback, a ``__del__``) is not printed by
    ``sys.unraisablehook``: the loop raises it at the next step boundary."""

    def __init__(self) -> None:
        self.caught = False
        self._restore: Callable[[], object] = lambda: None

    def install(self) -> SigintLatch:
        self.caught = False
        if threading.current_thread() is threading.main_thread():

            def on_sigint(signum, frame):
                self.caught = True
                raise KeyboardInterrupt

            def on_unraisable(u) -> None:
                if not (self.caught and isinstance(u.exc_value, KeyboardInterrupt)):
                    old_hook(u)

            old = signal.signal(signal.SIGINT, on_sigint)
            old_hook, sys.unraisablehook = sys.unraisablehook, on_unraisable

            def restore() -> None:
                signal.signal(signal.SIGINT, old)
                sys.unraisablehook = old_hook

            self._restore = restore
        return self

    def restore(self) -> None:
        self._restore()
        self._restore = lambda: None
