"""The retry policy of calls to a sampler. gRPC's service-config retry is not used: it is per
channel (a probe could not opt out), capped at 5 attempts, and cannot retry a stream only before
its first message."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """max_retries: retries after the first attempt (None = until deadline_s); backoff /
    max_backoff: first and largest wait (s, doubling); deadline_s: give up this many seconds after
    the first attempt."""

    max_retries: int | None = 5
    backoff: float = 0.25
    max_backoff: float = 8.0
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_retries is None and self.deadline_s is None:
            raise ValueError("RetryPolicy: max_retries=None (unbounded) needs a deadline_s")
        if self.max_retries is not None and self.max_retries < 0:
            raise ValueError(f"RetryPolicy.max_retries must be >= 0, got {self.max_retries}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(
                "RetryPolicy backoff/max_backoff must be >= 0, got "
                f"{self.backoff}/{self.max_backoff}"
            )

    def delays(self) -> Iterator[float]:
        """The waits before retry 1, 2, ... (max_retries of them; endless when None)."""
        d = self.backoff
        for _ in itertools.count() if self.max_retries is None else range(self.max_retries):
            yield d
            d = min(d * 2, self.max_backoff)


NO_RETRY = RetryPolicy(max_retries=0)


def grpc_unavailable(e: BaseException) -> bool:
    """Retryable gRPC failure: the server is restarting or not up yet (UNAVAILABLE)."""
    return isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAVAILABLE


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    retryable: Callable[[BaseException], bool] = grpc_unavailable,
    on_retry: Callable[[BaseException, int, float], None] | None = None,
) -> T:
    """``fn()``, retried under ``policy`` while its exception is ``retryable``; on_retry(error,
    attempt, wait_s) is called before each wait. The last error is re-raised at the end."""
    t0 = time.monotonic()
    delays = policy.delays()
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as e:
            if not retryable(e):
                raise
            wait = next(delays, None)
            spent = time.monotonic() - t0
            if wait is None or (policy.deadline_s is not None and spent + wait > policy.deadline_s):
                raise
            attempt += 1
            if on_retry is not None:
                on_retry(e, attempt, wait)
            else:
                logger.debug("retry %d in %.2fs after %s", attempt, wait, e)
            time.sleep(wait)
