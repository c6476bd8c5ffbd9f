"""Audit: knowing that nothing was lost (the paper's §5 monitoring events).

Producers with auditing on count the messages they send per topic and
**time window** (by the messages' timestamps, ``window_ms`` wide) and, every
``interval_ms``, publish what they counted since the last time as one event
into the audit topic ``__raylog_audit``. Consumers with auditing on count
what they receive the same way and publish it too. :func:`audit_report`
reads the audit topic back, sums both sides per window and flags every
window where a group consumed fewer messages than were produced.

An event is a JSON object::

    {"kind": "produced" | "consumed", "source": "<producer or consumer id>",
     "group": "<group>" | null, "topic": "<topic>", "window_start": <ms>,
     "window_ms": <ms>, "count": <messages>, "sent_at": <ms>}

Counts are deltas: a source publishes each message once, so the sums over
all events of a window are the totals. Delivery is at-least-once, so a
window may show more consumed than produced (re-deliveries after a
rebalance); only a shortfall is flagged. Audit events themselves are not
audited.

**Across tiers** (the paper's check that no tier lost data: a live cluster
and the analysis cluster that mirrors it): :func:`window_counts` counts a
topic's messages per window by their timestamps, read from the log itself
on each side (the mirror keeps every message's create time), and
:func:`compare_tiers` puts the two side by side, flagging every window
whose counts differ (``missing``: the target holds fewer; ``extra``: more,
a duplicate). :mod:`raylog.mirror.audit` reads both clusters.

Thread-safety: :class:`AuditCounter` is guarded by its own lock; the owner
calls :meth:`AuditCounter.take` from one thread to publish.
"""

from __future__ import annotations

import collections
import json
import threading
import time
import uuid
from typing import Iterable, Protocol

AUDIT_TOPIC = "__raylog_audit"
DEFAULT_WINDOW_MS = 60_000
DEFAULT_INTERVAL_MS = 5_000


class AuditPublisher(Protocol):
    """Where a consumer's audit events go: the audit topic, through a
    producer (:class:`raylog.producer.audit_publisher.ProducerAuditPublisher`).
    The consumer sits beside the producer, not above it, so it is handed one."""

    def publish(self, events: list[bytes]) -> None:
        """Append ``events`` to :data:`AUDIT_TOPIC`; return once they are stored."""

    def close(self) -> None:
        """Release what publishing holds (a producer, its connections)."""


def new_source_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:12]}"


class AuditCounter:
    """Counts messages per (topic, window start)."""

    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS):
        self.window_ms = window_ms
        self._counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def add(self, topic: str, timestamp_ms: int, count: int = 1) -> None:
        if topic == AUDIT_TOPIC:
            return
        window = timestamp_ms - timestamp_ms % self.window_ms
        with self._lock:
            self._counts[(topic, window)] += count

    def add_timestamps(self, topic: str, timestamps: Iterable[int]) -> None:
        if topic == AUDIT_TOPIC:
            return
        w = self.window_ms
        windows = collections.Counter(ts - ts % w for ts in timestamps)
        with self._lock:
            for window, n in windows.items():
                self._counts[(topic, window)] += n

    def take(self) -> dict:
        """The counts since the last call (and forget them)."""
        with self._lock:
            counts, self._counts = self._counts, collections.Counter()
        return dict(counts)

    def events(self, kind: str, source: str, group: str | None = None) -> list[bytes]:
        now = int(time.time() * 1000)
        return [
            json.dumps(
                {
                    "kind": kind,
                    "source": source,
                    "group": group,
                    "topic": topic,
                    "window_start": window,
                    "window_ms": self.window_ms,
                    "count": count,
                    "sent_at": now,
                },
                separators=(",", ":"),
            ).encode()
            for (topic, window), count in sorted(self.take().items())
        ]


def audit_report(events: Iterable[bytes], topic: str | None = None, group: str | None = None) -> list[dict]:
    """Rows per (topic, window): produced, and consumed by each group; a row
    is ``short`` when a group (``group``, or any that consumed the topic)
    received fewer messages than were produced in that window."""
    produced: collections.Counter = collections.Counter()
    consumed: dict = collections.defaultdict(collections.Counter)
    widths = {}
    for raw in events:
        event = json.loads(raw)
        if topic is not None and event["topic"] != topic:
            continue
        key = (event["topic"], event["window_start"])
        widths[key] = event["window_ms"]
        if event["kind"] == "produced":
            produced[key] += event["count"]
        elif event["kind"] == "consumed":
            consumed[event.get("group") or ""][key] += event["count"]
    groups = [group] if group is not None else sorted(consumed)
    rows = []
    for key in sorted(set(produced) | {k for g in groups for k in consumed.get(g, {})}):
        row = {
            "topic": key[0],
            "window_start": key[1],
            "window_ms": widths[key],
            "produced": produced.get(key, 0),
            "consumed": {g: consumed.get(g, {}).get(key, 0) for g in groups},
        }
        row["short"] = sorted(g for g, n in row["consumed"].items() if n < row["produced"])
        rows.append(row)
    return rows


def window_counts(timestamps: Iterable[int], window_ms: int, counts: collections.Counter | None = None
                  ) -> collections.Counter:
    """Messages per window start (``timestamp - timestamp % window_ms``),
    added to ``counts`` when given."""
    counts = collections.Counter() if counts is None else counts
    for ts in timestamps:
        counts[ts - ts % window_ms] += 1
    return counts


def compare_tiers(source: dict, target: dict, window_ms: int, *, since_ms: int | None = None,
                  until_ms: int | None = None) -> list[dict]:
    """One row per window start in ``[since_ms, until_ms)`` that either side
    counted: ``{"window_start", "window_ms", "source", "target", "status"}``,
    status ``ok``, ``missing`` (the target holds fewer messages of the
    window than the source) or ``extra`` (more: a duplicate)."""
    rows = []
    for window in sorted(set(source) | set(target)):
        if (since_ms is not None and window < since_ms) or (until_ms is not None and window >= until_ms):
            continue
        a, b = source.get(window, 0), target.get(window, 0)
        rows.append({"window_start": window, "window_ms": window_ms, "source": a, "target": b,
                     "status": "ok" if a == b else "missing" if b < a else "extra"})
    return rows
