"""Metrics of partitions and consumer groups, through Ray's metrics API.

raylog records with :mod:`ray.util.metrics` (Counter, Gauge, Histogram);
Ray's metrics agent on each node exports them in the Prometheus format on
the node's metrics export port, with Ray's ``ray_`` prefix::

    ray_raylog_partition_high_watermark{cluster="default",topic="clicks",partition="3",...} 1.2e+09

Per partition (tags ``cluster``, ``topic``, ``partition``), recorded by the
partition actor:

- ``raylog_partition_bytes_in`` (counter): bytes appended to the log;
- ``raylog_partition_messages_in`` (counter): messages appended (a
  compressed set counts as one);
- ``raylog_partition_message_sets_in`` (counter): message sets appended
  (producer batches; a compressed wrapper is one set);
- ``raylog_partition_bytes_out`` (counter): bytes the data server sent
  (fetch replies with their log data, produce replies);
- ``raylog_partition_flush_latency_ms`` (histogram): duration of the flushes
  the actor's timer runs (``flush_ms``); the flushes ``flush_messages``
  starts on the log's own flush threads are not timed;
- ``raylog_partition_high_watermark`` (gauge): the high watermark (byte offset);
- ``raylog_partition_log_start_offset`` (gauge): the log start offset (moves
  with retention and with ``client.delete_records``);
- ``raylog_partition_log_size_bytes`` (gauge): bytes in the segment files;
- ``raylog_partition_segments`` (gauge): number of segment files;
- ``raylog_partition_recovery_truncated_bytes`` (counter): bytes recovery
  cut off a torn or corrupt tail when the log was opened (docs/design.md §3);
- ``raylog_partition_recovery_damaged_bytes`` (counter): damaged flushed
  bytes recovery found and kept (readers skip them with
  ``consumer.skip_corrupt()``);
- ``raylog_partition_disk_full`` (gauge): 1 while the partition refuses
  writes because its disk is full (``DiskFullError``), else 0.

The actor touches no metric per request: its timer thread reads the cheap
counters the log and the data server keep anyway
(:meth:`PartitionMetrics.sample`, about once a second), and each flush of
its log, whichever thread runs it, is timed once
(:meth:`PartitionMetrics.observe_flush`, the log's ``on_flush`` hook). Counters
count from the start of the actor process; Ray labels each series with its
worker, so a restarted actor starts a new series.

Messages in come from the log's running total of appended messages
(``PartitionLog.messages_appended``, outer messages: a compressed set counts
as one); message sets in come from the data server's counter of produce
sets, so the two together give the mean batch size.

Per consumer (tags ``cluster``, ``topic``, ``partition``), recorded by
``consumer.skip_corrupt()`` when the process has a Ray connection
(:func:`record_corrupt_skip`): ``raylog_consumer_skipped_corrupt_ranges``
(counter: damaged ranges skipped) and
``raylog_consumer_skipped_corrupt_bytes`` (counter: their bytes).

Per consumer group (tags ``cluster``, ``group``, ``topic``, ``partition``),
recorded by whoever calls :func:`record_group_lag` (a driver, a monitoring
loop, the demo): ``raylog_group_lag`` (bytes between the committed offset
and the high watermark) and ``raylog_group_committed_offset``.

Per mirrored partition (tags ``cluster`` (the target's), ``mirror``,
``topic`` (the source's), ``partition``), recorded by the mirror's
controller every few seconds (:func:`record_mirror_lag`):
``raylog_mirror_lag_messages`` (messages of the source partition not yet
copied; absent while the count is past its bound),
``raylog_mirror_lag_seconds`` (how long the oldest of them has waited; 0
when caught up) and ``raylog_mirror_lag_bytes``.

Thread-safety: :class:`PartitionMetrics` guards its state with a lock, so
the timer thread and the actor's method threads may both call it.
"""

from __future__ import annotations

import logging
import threading

from raylog.errors import ConfigError

logger = logging.getLogger(__name__)

#: how often the partition actor's timer samples its counters, in seconds
SAMPLE_INTERVAL_S = 1.0

#: bucket boundaries of the flush latency histogram, in milliseconds
FLUSH_LATENCY_BOUNDARIES_MS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000]

PARTITION_TAG_KEYS = ("cluster", "topic", "partition")
GROUP_TAG_KEYS = ("cluster", "group", "topic", "partition")
MIRROR_TAG_KEYS = ("cluster", "mirror", "topic", "partition")


class PartitionMetrics:
    """The metrics of one partition (see the module docstring).

    ``log`` is the partition's :class:`~raylog.storage.log.PartitionLog`,
    opened (and so recovered) already: its end offset is the starting point
    of ``bytes_in``, and its recovery reports are counted once here.
    """

    #: how often the owner should call :meth:`sample`, in seconds
    interval_s = SAMPLE_INTERVAL_S

    def __init__(self, cluster: str, topic: str, partition: int, log):
        from ray.util.metrics import Counter, Gauge, Histogram  # heavy, lazy on purpose

        self.tags = {"cluster": cluster, "topic": topic, "partition": str(partition)}
        keys = PARTITION_TAG_KEYS
        self._bytes_in = Counter("raylog_partition_bytes_in", "bytes appended to the partition log", keys)
        self._sets_in = Counter(
            "raylog_partition_message_sets_in", "message sets (producer batches) appended to the partition log", keys
        )
        self._messages_in = Counter(
            "raylog_partition_messages_in", "messages appended to the partition log (a compressed set counts as one)", keys
        )
        self._bytes_out = Counter("raylog_partition_bytes_out", "bytes sent by the partition's data server", keys)
        self._flush_latency = Histogram(
            "raylog_partition_flush_latency_ms",
            "duration of the partition log flushes run by the partition's timer (fsync + checkpoint)",
            boundaries=FLUSH_LATENCY_BOUNDARIES_MS,
            tag_keys=keys,
        )
        self._high_watermark = Gauge("raylog_partition_high_watermark", "high watermark (byte offset)", keys)
        self._log_start = Gauge("raylog_partition_log_start_offset", "log start offset (byte offset)", keys)
        self._size = Gauge("raylog_partition_log_size_bytes", "bytes in the partition's segment files", keys)
        self._segments = Gauge("raylog_partition_segments", "segment files of the partition log", keys)
        self._truncated = Counter(
            "raylog_partition_recovery_truncated_bytes",
            "bytes cut off a torn or corrupt log tail by recovery",
            keys,
        )
        self._damaged = Counter(
            "raylog_partition_recovery_damaged_bytes",
            "damaged flushed bytes found (and kept) by recovery",
            keys,
        )
        self._disk_full = Gauge("raylog_partition_disk_full", "1 while the partition's disk is full", keys)
        self._lock = threading.Lock()
        self._failed_once = False
        # what was last handed to Ray, for snapshot() and the next deltas
        self._base_end_offset = log.log_end_offset
        self._values = {
            "bytes_in_total": 0,
            "message_sets_in_total": 0,
            "messages_in_total": 0,
            "bytes_out_total": 0,
            "flushes_timed": 0,
            "flush_latency_ms_sum": 0.0,
            "flush_latency_ms_max": 0.0,
            "high_watermark": log.high_watermark,
            "log_start_offset": log.log_start_offset,
            "log_size_bytes": 0,
            "segments": 0,
            "recovery_truncated_bytes": 0,
            "recovery_damaged_bytes": 0,
            "disk_full": 0,
        }
        truncated = sum(report.truncated_bytes for report in log.recovery_reports)
        if truncated:
            self._guarded(self._truncated.inc, truncated, self.tags)
            self._values["recovery_truncated_bytes"] = truncated
        damaged = sum(r.end_offset - r.start_offset for r in log.recovery_reports if getattr(r, "kept", False))
        if damaged:
            self._guarded(self._damaged.inc, damaged, self.tags)
            self._values["recovery_damaged_bytes"] = damaged

    def _guarded(self, record, *args) -> None:
        # A metric must never take the partition down: log the first failure only.
        try:
            record(*args)
        except Exception:  # noqa: BLE001
            if not self._failed_once:
                self._failed_once = True
                logger.exception("recording a metric of %s failed; further failures are not logged", self.tags)

    def observe_flush(self, seconds: float) -> None:
        """Record one flush that took ``seconds``."""
        ms = seconds * 1000.0
        with self._lock:
            self._guarded(self._flush_latency.observe, ms, self.tags)
            values = self._values
            values["flushes_timed"] += 1
            values["flush_latency_ms_sum"] += ms
            if ms > values["flush_latency_ms_max"]:
                values["flush_latency_ms_max"] = ms

    def sample(self, log, server_stats: dict) -> None:
        """Read the log's offsets and size and the data server's counters
        (``DataServer.stats()``), and hand the changes to Ray. Never raises."""
        self._guarded(self._sample, log, server_stats)

    def _sample(self, log, server_stats: dict) -> None:
        bytes_in = max(0, log.log_end_offset - self._base_end_offset)
        current = {
            "bytes_in_total": bytes_in,
            "message_sets_in_total": server_stats.get("message_sets_in", 0),
            "messages_in_total": log.messages_appended,
            "bytes_out_total": server_stats.get("bytes_out", 0),
        }
        gauges = {
            "high_watermark": log.high_watermark,
            "log_start_offset": log.log_start_offset,
            "log_size_bytes": log.size_bytes,
            "segments": len(log.segment_bases),
            "disk_full": int(bool(getattr(log, "disk_full", False))),
        }
        counters = {
            "bytes_in_total": self._bytes_in,
            "message_sets_in_total": self._sets_in,
            "messages_in_total": self._messages_in,
            "bytes_out_total": self._bytes_out,
        }
        metric_of = {
            "high_watermark": self._high_watermark,
            "log_start_offset": self._log_start,
            "log_size_bytes": self._size,
            "segments": self._segments,
            "disk_full": self._disk_full,
        }
        with self._lock:
            values = self._values
            for name, total in current.items():
                delta = total - values[name]
                if delta > 0:
                    self._guarded(counters[name].inc, delta, self.tags)
                    values[name] = total
            for name, value in gauges.items():
                self._guarded(metric_of[name].set, value, self.tags)
                values[name] = value

    def snapshot(self) -> dict:
        """The values last recorded (counters as totals since the actor started)."""
        with self._lock:
            return {"tags": dict(self.tags), **self._values}


# --------------------------------------------------------------------------
# consumers

_skip_counters = None


def record_corrupt_skip(cluster: str, topic: str, partition: int, skipped_bytes: int) -> bool:
    """Count one damaged range skipped by ``consumer.skip_corrupt()``
    (``raylog_consumer_skipped_corrupt_ranges`` and ``..._bytes``). Only in
    a process connected to Ray (the metrics go through its agent); returns
    whether it was recorded. Never raises."""
    global _skip_counters
    try:
        import ray  # heavy, lazy on purpose

        if not ray.is_initialized():
            return False
        with _group_lock:
            if _skip_counters is None:
                from ray.util.metrics import Counter  # heavy, lazy on purpose

                _skip_counters = (
                    Counter("raylog_consumer_skipped_corrupt_ranges", "damaged log ranges a consumer skipped",
                            PARTITION_TAG_KEYS),
                    Counter("raylog_consumer_skipped_corrupt_bytes", "bytes of damaged log ranges a consumer skipped",
                            PARTITION_TAG_KEYS),
                )
        tags = {"cluster": cluster, "topic": topic, "partition": str(partition)}
        _skip_counters[0].inc(1, tags)
        if skipped_bytes > 0:
            _skip_counters[1].inc(skipped_bytes, tags)
        return True
    except Exception:  # noqa: BLE001 - a metric never fails the consumer
        logger.exception("recording the skip of corrupt bytes of %s-%d failed", topic, partition)
        return False


# --------------------------------------------------------------------------
# consumer groups

_group_gauges = None
_group_lock = threading.Lock()


def _gauges():
    global _group_gauges
    with _group_lock:
        if _group_gauges is None:
            from ray.util.metrics import Gauge  # heavy, lazy on purpose

            _group_gauges = (
                Gauge(
                    "raylog_group_lag",
                    "bytes between a consumer group's committed offset and the partition's high watermark",
                    GROUP_TAG_KEYS,
                ),
                Gauge("raylog_group_committed_offset", "a consumer group's committed offset", GROUP_TAG_KEYS),
            )
        return _group_gauges


def record_group_lag(client, group: str) -> dict[tuple[str, int], int]:
    """Set the lag and committed-offset gauges of ``group``, one series per
    (topic, partition) it has committed offsets for, from
    ``client.describe_group(group)``. Returns ``{(topic, partition): lag}``
    as recorded.

    Needs a Ray connection in this process (the metrics go through Ray's
    metrics agent); call it every few seconds to keep the gauges current.
    Raises :class:`raylog.UnknownGroupError` for a group that does not exist.
    """
    import ray  # heavy, lazy on purpose

    if not ray.is_initialized():
        raise ConfigError(
            "record_group_lag needs a Ray connection (metrics go through Ray's metrics agent); "
            "use a client from raylog.connect(...) or call ray.init(address=...) first"
        )
    lag_gauge, committed_gauge = _gauges()
    recorded = {}
    for row in client.describe_group(group):
        if row.get("topic") is None or row.get("committed") is None:
            continue  # an idle member's row, or nothing committed yet
        tags = {
            "cluster": client.settings.cluster,
            "group": group,
            "topic": row["topic"],
            "partition": str(row["partition"]),
        }
        committed_gauge.set(row["committed"], tags)
        lag = row.get("lag_bytes")
        if lag is not None:
            lag_gauge.set(lag, tags)
            recorded[(row["topic"], row["partition"])] = lag
    return recorded


_mirror_gauges = None


def record_mirror_lag(cluster: str, mirror: str, rows: list[dict]) -> int:
    """Set the mirror lag gauges from ``rows`` (the partition rows of a
    mirror's status: ``topic``, ``partition``, ``lag_messages``, ``lag_s``,
    ``lag_bytes``; a None is left unset). Needs a Ray connection (a mirror's
    controller has one). Returns how many rows were recorded."""
    global _mirror_gauges
    with _group_lock:
        if _mirror_gauges is None:
            from ray.util.metrics import Gauge  # heavy, lazy on purpose

            _mirror_gauges = {
                "lag_messages": Gauge("raylog_mirror_lag_messages",
                                      "messages of a source partition a mirror has not copied yet", MIRROR_TAG_KEYS),
                "lag_s": Gauge("raylog_mirror_lag_seconds",
                               "how long the oldest message a mirror has not copied has waited", MIRROR_TAG_KEYS),
                "lag_bytes": Gauge("raylog_mirror_lag_bytes",
                                   "bytes of a source partition a mirror has not copied yet", MIRROR_TAG_KEYS),
            }
        gauges = _mirror_gauges
    for row in rows:
        tags = {"cluster": cluster, "mirror": mirror, "topic": row["topic"], "partition": str(row["partition"])}
        for key, gauge in gauges.items():
            if row.get(key) is not None:
                gauge.set(row[key], tags)
    return len(rows)
