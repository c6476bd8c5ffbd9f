"""Helpers shared by the consumer tests (imported by name: pytest puts this
folder on the path, as the test files here have no package)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float, what: str, polling=(), sink=None):
    """Wait for ``predicate``; meanwhile poll ``polling`` (a rebalance needs
    its members to poll: revocation runs on the application's thread),
    keeping what they return in ``sink``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        for c in polling:
            got = c.poll(timeout_ms=20)
            if sink is not None:
                sink.extend(got)
        time.sleep(0.02)
