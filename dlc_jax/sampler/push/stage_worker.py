"""One background worker of a push's receive pipeline (the socket plane's checks, the engine's
tensor-by-tensor load): items handled in order, the first error kept and raised by `finish()`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

_END = object()


class StageWorker:
    """`fn(item)` for every `put(item)`, in order, on one daemon thread."""

    def __init__(self, fn: Callable[[object], None], name: str):
        self._fn = fn
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not _END:
            if self.error is not None or self._stop:
                continue
            try:
                self._fn(item)
            except BaseException as e:  # noqa: BLE001 - raised by finish() in the owner
                self.error = e

    def put(self, item: object) -> None:
        self._q.put(item)

    def finish(self) -> None:
        """Wait until every item put so far is handled; raise the first error."""
        self._q.put(_END)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        """Skip the items not started yet and wait for the one in progress (idempotent)."""
        self._stop = True
        if self._thread.is_alive():
            self._q.put(_END)
            self._thread.join()
