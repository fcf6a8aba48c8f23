"""Ctrl-C during a run: raised as Python's default handler does, and also recorded, so an
interrupt that lands in a callback that swallows exceptions (JAX's gc callback) still stops the run
at the next step boundary."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


class SigintLatch:
    """`install` sets a SIGINT handler that records the interrupt (``caught``) and raises
    KeyboardInterrupt; `restore` puts the previous handler back. Outside the main thread (where
    signal handlers cannot be set) it installs nothing and ``caught`` stays False."""

    def __init__(self) -> None:
        self.caught = False
        self._restore: Callable[[], object] = lambda: None

    def install(self) -> SigintLatch:
        self.caught = False
        if threading.current_thread() is threading.main_thread():

            def on_sigint(signum, frame):
                self.caught = True
                raise KeyboardInterrupt

            old = signal.signal(signal.SIGINT, on_sigint)
            self._restore = lambda: signal.signal(signal.SIGINT, old)
        return self

    def restore(self) -> None:
        self._restore()
        self._restore = lambda: None
