"""RetryPolicy: bounded tries, back-off, deadline, only retriable errors."""

from __future__ import annotations

import pytest

from raylog.errors import BrokerUnavailableError, ConfigError
from raylog.retry import RetryPolicy


def _failing(times: int, error):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return len(calls)

    return fn, calls


def test_non_retriable_errors_are_raised_at_once():
    fn, calls = _failing(5, ConfigError("bad"))
    with pytest.raises(ConfigError):
        RetryPolicy(max_tries=5, delay_s=0).call(fn)
    assert len(calls) == 1


def test_retriable_errors_are_retried_until_success():
    fn, calls = _failing(2, BrokerUnavailableError("down"))
    assert RetryPolicy(max_tries=5, delay_s=0).call(fn) == 3


def test_tries_are_bounded_and_the_last_error_is_raised():
    fn, calls = _failing(10, BrokerUnavailableError("down"))
    with pytest.raises(BrokerUnavailableError):
        RetryPolicy(max_tries=3, delay_s=0).call(fn)
    assert len(calls) == 3


def test_retry_on_extends_what_is_retried_and_on_retry_sees_each_error():
    fn, calls = _failing(2, KeyError("x"))
    seen = []
    assert RetryPolicy(max_tries=3, delay_s=0).call(fn, retry_on=(KeyError,), on_retry=seen.append) == 3
    assert len(seen) == 2


def test_the_deadline_stops_retries_before_a_sleep_would_pass_it():
    fn, calls = _failing(10, BrokerUnavailableError("down"))
    with pytest.raises(BrokerUnavailableError):
        RetryPolicy(max_tries=10, delay_s=5.0, deadline_s=1.0).call(fn)
    assert len(calls) == 1


def test_delays_grow_and_are_capped():
    delays = list(RetryPolicy(max_tries=6, delay_s=0.1, backoff=2, max_delay_s=0.5, jitter=0).delays())
    assert delays == [0.1, 0.2, 0.4, 0.5, 0.5]
