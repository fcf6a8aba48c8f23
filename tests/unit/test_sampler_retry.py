"""The one retry policy (`dlc_jax.sampler.client.retry`): attempts, waits, deadline and what is
retried, by hand-counted calls; and a real gRPC client against a port nobody listens on: the
client's policy retries UNAVAILABLE, a per-call policy overrides it for that call only."""

from __future__ import annotations

import socket
import time

import grpc
import pytest

from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.client.retry import NO_RETRY, RetryPolicy, call_with_retry


class Flaky(Exception):
    pass


def _failing(n_failures: int, exc=Flaky):
    calls = []

    def fn():
        calls.append(time.monotonic())
        if len(calls) <= n_failures:
            raise exc(f"failure {len(calls)}")
        return len(calls)

    return fn, calls


def test_delays_double_up_to_the_cap():
    assert list(RetryPolicy(max_retries=5, backoff=0.5, max_backoff=3.0).delays()) == [
        0.5,
        1.0,
        2.0,
        3.0,
        3.0,
    ]
    assert list(NO_RETRY.delays()) == []
    with pytest.raises(ValueError, match="deadline_s"):
        RetryPolicy(max_retries=None)


def test_retries_then_succeeds_or_reraises():
    fast = RetryPolicy(max_retries=3, backoff=0.0, max_backoff=0.0)
    fn, calls = _failing(3)
    assert call_with_retry(fn, fast, retryable=lambda e: isinstance(e, Flaky)) == 4
    fn, calls = _failing(4)
    with pytest.raises(Flaky, match="failure 4"):
        call_with_retry(fn, fast, retryable=lambda e: isinstance(e, Flaky))
    assert len(calls) == 4  # 1 attempt + 3 retries
    fn, calls = _failing(4, exc=KeyError)  # not retryable: raised at once
    with pytest.raises(KeyError):
        call_with_retry(fn, fast, retryable=lambda e: isinstance(e, Flaky))
    assert len(calls) == 1
    seen = []
    fn, calls = _failing(2)
    call_with_retry(
        fn, fast, retryable=lambda e: True, on_retry=lambda e, a, w: seen.append((str(e), a, w))
    )
    assert seen == [("failure 1", 1, 0.0), ("failure 2", 2, 0.0)]


def test_deadline_bounds_an_unbounded_policy():
    fn, calls = _failing(10**6)
    t0 = time.monotonic()
    with pytest.raises(Flaky):
        call_with_retry(
            fn,
            RetryPolicy(max_retries=None, backoff=0.05, max_backoff=0.05, deadline_s=0.3),
            retryable=lambda e: True,
        )
    assert 0.2 <= time.monotonic() - t0 < 1.0 and 4 <= len(calls) <= 8


def test_client_policy_and_per_call_override_on_a_dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    c = SamplerClient(f"127.0.0.1:{port}", timeout=5, max_retries=3, backoff=0.2, max_backoff=1.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as ei:
            c.info()
        slow = time.monotonic() - t0
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE and slow >= 0.2 + 0.4 + 0.8
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError):
            c.info(retry=NO_RETRY, timeout=2)
        assert time.monotonic() - t0 < 1.0
        assert (
            c.retry == RetryPolicy(max_retries=3, backoff=0.2, max_backoff=1.0) and c.timeout == 5
        )
        with pytest.raises(TimeoutError, match="not ready after 0.5s"):
            c.wait_ready(0.5)
    finally:
        c.close()
