"""Orbax reads that fail in one line: the reads abandoned by a failed restore are dropped quietly.

Orbax runs a restore's TensorStore reads on a fresh asyncio loop and closes it as soon as the
first read fails (a bit-rotted or truncated checkpoint), while the other reads are still running.
When each of those finishes, TensorStore hands its result to the closed loop
(``call_soon_threadsafe``), which raises ``RuntimeError: Event loop is closed`` in a TensorStore
thread, printed as a traceback after the one-line error (8 of 10 damaged-checkpoint exports did
this); reads that failed alongside the first leave tasks whose exceptions nobody retrieves,
logged with their tracebacks ("Task exception was never retrieved") when they are collected.
`quiet_reads` makes the loops orbax creates during a restore drop a callback that arrives after
they closed, and log those unretrieved exceptions of a closed loop at debug level: the abandoned
reads' results are discarded, as orbax already discarded them (the first error is raised).
`QuietManager` wraps a ``CheckpointManager`` so that every ``restore`` (resume, verify-on-save,
`dlc-jax export`, LoRA export) runs that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)


class _DropAfterClose(asyncio.SelectorEventLoop):
    """An event loop that ignores ``call_soon_threadsafe`` once closed (an abandoned read's
    completion), instead of raising into the thread that completed it."""

    def call_soon_threadsafe(self, callback, *args, context=None):  # type: ignore[override]
        if self.is_closed():
            return None
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        except RuntimeError:
            if self.is_closed():  # closed between the check and the call
                return None
            raise

    def call_exception_handler(self, context: dict) -> None:
        if self.is_closed() and "never retrieved" in str(context.get("message", "")):
            logger.debug(
                "orbax read abandoned after a failed restore: %s", context.get("exception")
            )
            return
        super().call_exception_handler(context)


class _Policy(asyncio.DefaultEventLoopPolicy):  # type: ignore[misc,valid-type]
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _DropAfterClose()


_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: Any = None


@contextlib.contextmanager
def quiet_reads() -> Iterator[None]:
    """Event loops made inside this block (orbax's, for a restore) drop callbacks that arrive
    after they closed. Re-entrant and thread-safe (the policy is process-wide while any block is
    open; loops made meanwhile elsewhere only differ after they close)."""
    global _DEPTH, _SAVED
    with _LOCK:
        if _DEPTH == 0:
            _SAVED = asyncio.get_event_loop_policy()
            asyncio.set_event_loop_policy(_Policy())
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                asyncio.set_event_loop_policy(_SAVED)
                _SAVED = None


class QuietManager:
    """A ``CheckpointManager`` whose ``restore`` runs under `quiet_reads`; everything else is
    the manager's own."""

    def __init__(self, mgr: Any) -> None:
        self._inner = mgr

    def restore(self, *args: Any, **kwargs: Any) -> Any:
        with quiet_reads():
            return self._inner.restore(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
