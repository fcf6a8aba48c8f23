"""Orbax reads that fail in one line: the reads abandoned by a failed restore are dropped quietly.

Orbax runs a restore's TensorStore reads on a fresh asyncio loop and closes it when the first read
fails; each read still running then hands its result to the closed loop (``RuntimeError: Event
loop is closed`` printed from a TensorStore thread) or leaves an unretrieved task exception.
`quiet_reads` makes the loops orbax creates drop such late callbacks and log those exceptions at
debug level; `QuietManager` runs every ``restore`` of a ``CheckpointManager`` that way.
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
