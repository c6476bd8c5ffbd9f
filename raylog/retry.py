"""Retry as a value object: bounded tries, exponential back-off with jitter,
and an overall deadline (in the manner of kazoo's ``KazooRetry``).

Usage::

    policy = RetryPolicy(max_tries=5, deadline_s=10)
    result = policy.call(fetch, offset, retry_on=(BrokerUnavailableError,))

Only errors whose ``retriable`` property is true (or that are listed in
``retry_on``, or for which ``retry_if(err)`` is true) are retried; the last
error is raised when tries or the deadline run out. A policy is immutable
and safe to share between threads.

Loops that cannot be written as one call (a fetcher that keeps reading, a
member that waits on a condition) take a :class:`Backoff` from
:meth:`RetryPolicy.start` instead of counting sleeps by hand::

    backoff = policy.start()
    while True:
        try:
            step()
            backoff.reset()              # a success restarts the back-off
        except BrokerUnavailableError:
            if not backoff.wait(stop):   # sleeps, or wakes early when stop is set
                raise                    # tries or deadline exhausted
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_tries: int = 5
    delay_s: float = 0.05
    backoff: float = 2.0
    max_delay_s: float = 2.0
    jitter: float = 0.2
    deadline_s: float | None = 30.0

    @classmethod
    def forever(cls, delay_s: float = 0.05, max_delay_s: float = 2.0, jitter: float = 0.5) -> "RetryPolicy":
        """Jittered exponential back-off with no limit on tries or time (for
        loops that retry as long as their owner lives and stop on an event)."""
        return cls(max_tries=2**62, delay_s=delay_s, max_delay_s=max_delay_s, jitter=jitter, deadline_s=None)

    @classmethod
    def until(cls, deadline_s: float, delay_s: float = 0.05, max_delay_s: float = 1.0, jitter: float = 0.2) -> "RetryPolicy":
        """Back-off bounded by time alone (tries unlimited)."""
        return cls(max_tries=2**62, delay_s=delay_s, max_delay_s=max_delay_s, jitter=jitter, deadline_s=deadline_s)

    def start(self) -> "Backoff":
        """A fresh back-off state for a hand-driven retry loop."""
        return Backoff(self)

    def delays(self) -> Iterator[float]:
        """The sleeps between tries (``max_tries - 1`` of them)."""
        delay = self.delay_s
        for _ in range(self.max_tries - 1):
            yield min(self.max_delay_s, delay) * (1 + random.uniform(-self.jitter, self.jitter))
            delay *= self.backoff

    def call(
        self,
        fn: Callable[..., T],
        *args,
        retry_on: tuple[type[BaseException], ...] = (),
        retry_if: Callable[[BaseException], bool] | None = None,
        on_retry: Callable[[BaseException], None] | None = None,
        **kwargs,
    ) -> T:
        start = time.monotonic()
        delays = self.delays()
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - filtered just below
                if not (
                    getattr(err, "retriable", False)
                    or isinstance(err, retry_on)
                    or (retry_if is not None and retry_if(err))
                ):
                    raise
                pause = next(delays, None)
                if pause is None:
                    raise
                if self.deadline_s is not None and time.monotonic() - start + pause > self.deadline_s:
                    raise
                if on_retry is not None:
                    on_retry(err)
                time.sleep(pause)


class Backoff:
    """The state of one retry loop under a :class:`RetryPolicy`: the next
    delay, tries left and the deadline (measured from creation or the last
    :meth:`reset`). Not shared between threads."""

    __slots__ = ("policy", "_delays", "_start", "tries")

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.reset()

    def reset(self) -> None:
        """Start over: first delay, full tries, a new deadline."""
        self._delays = self.policy.delays()
        self._start = time.monotonic()
        self.tries = 0

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._start

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline (``None``: no deadline)."""
        if self.policy.deadline_s is None:
            return None
        return max(0.0, self.policy.deadline_s - self.elapsed_s)

    def next_delay(self) -> float | None:
        """The next sleep, or ``None`` when tries or the deadline are used up
        (a sleep that would pass the deadline is cut to end at it, once)."""
        pause = next(self._delays, None)
        if pause is None:
            return None
        left = self.remaining_s()
        if left is not None:
            if left <= 0:
                return None
            pause = min(pause, left)
        self.tries += 1
        return pause

    def wait(self, wake: threading.Event | None = None) -> bool:
        """Sleep the next delay; ``False`` (at once) when tries or the
        deadline are used up. With ``wake``, the sleep ends early when the
        event is set (the caller checks the event itself)."""
        pause = self.next_delay()
        if pause is None:
            return False
        if wake is not None:
            wake.wait(pause)
        else:
            time.sleep(pause)
        return True
