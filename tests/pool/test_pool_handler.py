"""The handler inside a member (raylog.pool.handler), without Ray:
functions and classes, setup and teardown, retries with back-off, giving
up after max tries, a stop that ends the wait, and ``around`` (the pool's
outputs made inside each try; a fence passes through)."""

from __future__ import annotations

import threading

import pytest

from raylog.consumer.record import Message
from raylog.pool.handler import HandlerRunner
from raylog.retry import RetryPolicy

FAST = RetryPolicy(max_tries=3, delay_s=0.001, max_delay_s=0.002, jitter=0.0, deadline_s=None)


def _batch(n=3, start=0):
    return [Message("t", 0, start + i * 10, 0, None, b"v%d" % i) for i in range(n)]


def test_a_function_is_called_with_the_batch():
    seen = []
    runner = HandlerRunner(seen.append, FAST)
    batch = _batch()
    assert runner.run(batch) is None
    assert seen == [batch]


class Counting:
    made = []

    def __init__(self):
        self.calls, self.events = 0, []
        Counting.made.append(self)

    def setup(self):
        self.events.append("setup")

    def __call__(self, batch):
        self.calls += 1

    def teardown(self):
        self.events.append("teardown")


def test_a_class_is_made_once_with_setup_and_teardown():
    Counting.made.clear()
    runner = HandlerRunner(Counting, FAST)
    runner.run(_batch())
    runner.run(_batch())
    runner.teardown()
    (made,) = Counting.made
    assert made.calls == 2 and made.events == ["setup", "teardown"]


def test_a_handler_that_fails_twice_is_retried_and_succeeds():
    calls, failures = [], []

    def flaky(batch):
        calls.append(batch[0].offset)
        if len(calls) <= 2:
            raise ValueError(f"boom {len(calls)}")

    runner = HandlerRunner(flaky, FAST)
    assert runner.run(_batch(start=40), on_failure=failures.append) is None
    assert calls == [40, 40, 40]  # the same batch each time
    assert [f.failures for f in failures] == [1, 2] and "ValueError: boom 2" == failures[-1].error


def test_a_handler_that_always_fails_gives_up_after_max_tries():
    def broken(batch):
        raise RuntimeError("never")

    failure = HandlerRunner(broken, FAST).run(_batch(start=70))
    assert failure is not None and failure.failures == 3 and failure.offset == 70
    assert "RuntimeError: never" in failure.error and "raise RuntimeError" in failure.traceback


def test_a_stop_ends_the_wait_between_tries():
    stop = threading.Event()
    slow = RetryPolicy(max_tries=5, delay_s=60.0, max_delay_s=60.0, jitter=0.0, deadline_s=None)

    def broken(batch):
        stop.set()
        raise RuntimeError("once")

    with pytest.raises(InterruptedError):
        HandlerRunner(broken, slow, stop).run(_batch())


def test_around_makes_each_try_and_its_errors_count_as_the_handlers():
    from raylog.pool.handler import BatchAbandoned

    delivered, failures = [], []

    def shout(batch):
        return [m.value.upper() for m in batch]

    def deliver(call):  # the pool's outputs: after the handler, inside the try
        outputs = call()
        if not failures:
            raise OSError("the output topic did not take them")
        delivered.append(outputs)

    assert HandlerRunner(shout, FAST).run(_batch(2), on_failure=failures.append, around=deliver) is None
    assert delivered == [[b"V0", b"V1"]] and [f.error for f in failures] == ["OSError: the output topic did not take them"]

    def fenced(call):
        call()
        raise BatchAbandoned("a newer owner")

    failures.clear()
    with pytest.raises(BatchAbandoned):  # not a failure of the handler: not retried, not counted
        HandlerRunner(shout, FAST).run(_batch(), on_failure=failures.append, around=fenced)
    assert failures == []
