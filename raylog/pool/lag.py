"""A consumer group's lag per partition, in bytes, messages and seconds.

For each partition: the group's committed offset (ZooKeeper; with none,
where ``auto_offset_reset`` starts it), the partition's high watermark and
log start (its data server), and, when the group is behind, one small
fetch at the committed offset: the **first message not committed** gives
the lag in seconds (now minus its create time: how long the oldest
message waiting for the group has waited) and the mean size of the
messages there turns the lag in bytes into an estimate in messages (as
``raylog groups describe`` does). A group at the end has lag 0 in all
three. A partition that does not answer within the timeout has None.

The pool commits what its handler returned from every
``commit_interval_s``, so this lag includes up to that much of handled
but not yet committed work.

Thread-safety: stateless functions; each question opens its own connection.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from raylog.config import EARLIEST
from raylog.storage.decoding import decode_messages
from raylog.transfer.connection import BrokerConnection

#: bytes read at the committed offset (the first message's time, a size sample)
SAMPLE_BYTES = 16 * 1024
#: partitions asked at once
CONCURRENCY = 16


def partition_lag(metadata, store, group: str, topic: str, partition: int, *, reset: str = EARLIEST,
                  timeout_s: float = 5.0, now_s: float | None = None) -> dict:
    """One row: ``{topic, partition, committed, end, lag_bytes,
    lag_messages, lag_s, error}`` (``lag_messages`` is exact at 0 and an
    estimate above; see the module docstring)."""
    row = {"topic": topic, "partition": partition, "committed": None, "end": None, "lag_bytes": None,
           "lag_messages": None, "lag_s": None, "error": None}
    try:
        committed = store.committed(group, topic, partition)
        host, port = metadata.endpoint(topic, partition, wait_s=min(2.0, timeout_s))
        with BrokerConnection(host, port, token=metadata.settings.token, timeout_s=timeout_s) as conn:
            start, end = conn.offsets(topic, partition)
            at = committed if committed is not None else (start if reset == EARLIEST else end)
            at = max(at, start)  # below the log start: retention took it, reading starts at the start
            row.update(committed=committed, end=end, lag_bytes=max(0, end - at))
            if at >= end:
                row.update(lag_messages=0, lag_s=0.0)
                return row
            # a commit inside a compressed wrapper (an inner message's offset) reads the wrapper
            result = conn.fetch(topic, partition, at, SAMPLE_BYTES, inside_wrapper=True)
        records, used = decode_messages(result.data, result.offset)
        waiting = [r for r in records if r[0] >= at]
        if waiting:
            now = time.time() if now_s is None else now_s
            row["lag_s"] = max(0.0, now - waiting[0][1] / 1000.0)
            row["lag_messages"] = round(row["lag_bytes"] / (used / len(records)))
    except Exception as err:  # noqa: BLE001 - a partition not served now: its row says so
        row["error"] = f"{type(err).__name__}: {err}"
    return row


def group_lag(metadata, store, group: str, partitions, *, reset: str = EARLIEST, timeout_s: float = 5.0) -> list[dict]:
    """:func:`partition_lag` of every ``(topic, partition)``, asked concurrently."""
    partitions = sorted(partitions)
    if not partitions:
        return []
    now = time.time()
    with ThreadPoolExecutor(max_workers=min(CONCURRENCY, len(partitions))) as pool:
        return list(pool.map(lambda tp: partition_lag(metadata, store, group, tp[0], tp[1], reset=reset,
                                                      timeout_s=timeout_s, now_s=now), partitions))
