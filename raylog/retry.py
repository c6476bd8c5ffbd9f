"""Retry as a value object: bounded tries, exponential back-off with jitter,
and an overall deadline (in the manner of kazoo's ``KazooRetry``).

Usage::

    policy = RetryPolicy(max_tries=5, deadline_s=10)
    result = policy.call(fetch, offset, retry_on=(BrokerUnavailableError,))

Only errors whose ``retriable`` property is true (or that are listed in
``retry_on``) are retried; the last error is raised when tries or the
deadline run out. A policy is immutable and safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_tries: int = 5
    delay_s: float = 0.05
    backoff: float = 2.0
    max_delay_s: float = 2.0
    jitter: float = 0.2
    deadline_s: float | None = 30.0

    def delays(self):
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
        on_retry: Callable[[BaseException], None] | None = None,
        **kwargs,
    ) -> T:
        start = time.monotonic()
        delays = self.delays()
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - filtered just below
                if not (getattr(err, "retriable", False) or isinstance(err, retry_on)):
                    raise
                pause = next(delays, None)
                if pause is None:
                    raise
                if self.deadline_s is not None and time.monotonic() - start + pause > self.deadline_s:
                    raise
                if on_retry is not None:
                    on_retry(err)
                time.sleep(pause)
