"""RetryPolicy: bounded tries, back-off, deadline, only retriable errors."""

from __future__ import annotations

import time

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


def test_backoff_grows_resets_and_ends_at_its_tries():
    from raylog.retry import RetryPolicy

    b = RetryPolicy(max_tries=4, delay_s=0.01, backoff=2.0, max_delay_s=1.0, jitter=0.0, deadline_s=None).start()
    assert [b.next_delay() for _ in range(4)] == [0.01, 0.02, 0.04, None]
    b.reset()
    assert b.next_delay() == 0.01 and b.tries == 1


def test_backoff_stops_at_its_deadline_and_cuts_the_last_sleep():
    from raylog.retry import RetryPolicy

    b = RetryPolicy.until(0.15, delay_s=0.1, max_delay_s=0.1, jitter=0.0).start()
    assert b.wait() is True  # 0.1 s
    pause = b.next_delay()
    assert pause is not None and pause <= 0.05 + 1e-3  # cut to the deadline
    time.sleep(pause)
    assert b.next_delay() is None and b.wait() is False


def test_backoff_wait_wakes_early_on_its_event():
    import threading

    from raylog.retry import RetryPolicy

    stop = threading.Event()
    stop.set()
    b = RetryPolicy.forever(delay_s=30.0, max_delay_s=30.0).start()
    start = time.monotonic()
    assert b.wait(stop) is True
    assert time.monotonic() - start < 5.0  # woke on the event, not after 30 s


def test_retry_if_retries_what_its_predicate_accepts_and_nothing_else():
    from raylog.errors import StaleEpochError

    # not retriable, but it says the endpoint moved: a caller that refreshes retries it
    fn, calls = _failing(2, StaleEpochError("a newer incarnation serves"))
    moved = lambda err: getattr(err, "refresh_metadata", False)  # noqa: E731
    assert RetryPolicy(max_tries=5, delay_s=0).call(fn, retry_if=moved) == 3
    fn, calls = _failing(2, ConfigError("bad"))
    with pytest.raises(ConfigError):
        RetryPolicy(max_tries=5, delay_s=0).call(fn, retry_if=moved)
    assert len(calls) == 1
