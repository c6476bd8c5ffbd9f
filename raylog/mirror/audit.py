"""The audit across tiers: a mirrored topic counted per time window in the
source cluster and in the target, compared (:func:`raylog.audit.compare_tiers`).

Each side is counted from its own log: a group-less consumer reads every
partition from its first message up to the end offsets taken when the count
starts, and counts the messages per window of their timestamps (a mirror
copies each message with its create time, so the windows agree). Windows
that retention has already emptied on either side are left out: the
comparison starts at the later of the two sides' first windows. The window
still open (holding now) is left out too, unless ``until_ms`` says
otherwise: messages still arrive in it. Compare when the mirror has caught
up (``raylog mirror status``: lag 0), or give ``until_ms``.

Thread-safety: the functions keep no state.
"""

from __future__ import annotations

import collections
import time

from raylog.audit import compare_tiers, window_counts
from raylog.errors import ConfigError, RequestTimeoutError

#: the longest a side's count may take (a very large topic: give a larger one)
COUNT_TIMEOUT_S = 600.0


def count_windows(client, topic: str, window_ms: int, timeout_s: float = COUNT_TIMEOUT_S) -> collections.Counter:
    """``{window start: messages}`` of every message of ``topic`` now in
    ``client``'s cluster (up to the end offsets taken at the start)."""
    ends = client.end_offsets(topic)
    counts: collections.Counter = collections.Counter()
    if not any(ends.values()):
        return counts
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        deadline = time.monotonic() + timeout_s
        while any((consumer.position(topic, p) or 0) < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                raise RequestTimeoutError(f"counting {topic} per window took more than {timeout_s:g} s")
            for batch in consumer.poll_batch(timeout_ms=300):
                end = ends[batch.partition]
                offsets, stamps = batch.offsets, batch.timestamps
                if len(offsets) and offsets[len(offsets) - 1] >= end:  # past the end taken at the start
                    stamps = [t for o, t in zip(offsets, stamps) if o < end]
                window_counts(stamps, window_ms, counts)
    finally:
        consumer.close()
    return counts


def compare_topic(source, target, topic: str, target_topic: str | None = None, *, window_ms: int = 60_000,
                  until_ms: int | None = None, timeout_s: float = COUNT_TIMEOUT_S) -> list[dict]:
    """The rows of :func:`raylog.audit.compare_tiers` for ``topic`` in the
    ``source`` client's cluster and ``target_topic`` (default: the same
    name) in the ``target``'s: from the later of both sides' first windows,
    up to ``until_ms`` (default: the start of the window holding now)."""
    if not isinstance(window_ms, int) or isinstance(window_ms, bool) or window_ms <= 0:
        raise ConfigError(f"window_ms must be a positive number of milliseconds, got {window_ms!r}")
    target_topic = target_topic or topic
    if until_ms is None:
        now = int(time.time() * 1000)
        until_ms = now - now % window_ms
    a = count_windows(source, topic, window_ms, timeout_s)
    b = count_windows(target, target_topic, window_ms, timeout_s)
    firsts = [min(c) for c in (a, b) if c]
    since = max(firsts) if len(firsts) == 2 else None
    return compare_tiers(a, b, window_ms, since_ms=since, until_ms=until_ms)
