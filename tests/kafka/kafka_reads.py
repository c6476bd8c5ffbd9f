"""Reading back what Kafka clients stored, through raylog's own consumer
(shared by the front door's tests)."""

from __future__ import annotations

import time
import uuid

WAIT_S = 60.0


def raylog_read(raylog_client, topic: str, count: int, wait_s: float = WAIT_S) -> list:
    """Up to ``count`` messages of ``topic`` from its start (a fresh group),
    polling for at most ``wait_s``."""
    consumer = raylog_client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + wait_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=1000))
    finally:
        consumer.close()
    return got
