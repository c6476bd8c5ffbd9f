"""Reassignments that run beside the supervisor's pass, not inside it.

A reassignment waits for its new replicas to catch up and join the ISR, up
to :data:`~raylog.replication.repair.REPLACE_TIMEOUT_S` (two minutes); run
inside a repair pass it would hold that pass, and with it every other duty
of the supervisor (serving partitions whose actor died, removing deleted
logs), that long. :class:`BackgroundReassignments` runs each on a thread of
its own instead:

* at most one per partition (a pass that finds one running for the
  partition starts no other; its row says ``reassigning``);
* at most ``max_running`` at once (:data:`MAX_RUNNING`); a pass that finds
  them all busy starts nothing and the next pass tries again (row
  ``waiting``);
* each one bounded by its own timeout (the reassignment's), so a thread
  never outlives it by more than the reassignment's own cleanup;
* its outcome (``reassigned`` or ``failed``) is a row of the first pass
  after it ends (:meth:`BackgroundReassignments.finished`).

Thread-safety: :meth:`start`, :meth:`running` and :meth:`finished` may be
called from any thread; one lock guards the running set and the outcomes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

#: reassignments of one supervisor running at once
MAX_RUNNING = 4


class BackgroundReassignments:
    """The supervisor's running reassignments (see the module docstring)."""

    def __init__(self, max_running: int = MAX_RUNNING):
        if max_running < 1:
            raise ValueError("max_running must be at least 1")
        self._max = max_running
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], threading.Thread] = {}
        self._done: list[dict] = []

    def running(self, topic: str, partition: int) -> bool:
        with self._lock:
            return (topic, partition) in self._running

    def start(self, topic: str, partition: int, work: Callable[[], dict]) -> str:
        """Run ``work`` (a reassignment of ``topic``-``partition`` that
        returns its row) on a thread of its own: ``"started"``; ``"running"``
        when one of that partition runs already; ``"busy"`` when
        ``max_running`` run (nothing started)."""
        key = (topic, partition)
        with self._lock:
            if key in self._running:
                return "running"
            if len(self._running) >= self._max:
                return "busy"
            thread = threading.Thread(target=self._run, args=(key, work), daemon=True,
                                      name=f"raylog-reassign-{topic}-{partition}")
            self._running[key] = thread
        thread.start()
        return "started"

    def _run(self, key: tuple[str, int], work: Callable[[], dict]) -> None:
        try:
            row = work()
        except Exception as err:  # noqa: BLE001 - the outcome is a row, never a lost thread
            log.exception("reassignment of %s-%d failed", *key)
            row = {"topic": key[0], "partition": key[1], "node": "", "state": "failed", "detail": str(err)}
        with self._lock:
            self._done.append(row)
            del self._running[key]

    def finished(self) -> list[dict]:
        """The rows of the reassignments that ended since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the running reassignments; whether none runs."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = list(self._running.values())
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return not self._running
