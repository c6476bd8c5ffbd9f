"""The compaction workload of a fault run (``--workload compact``;
docs/design.md §3 and §6, checked by :mod:`raylog.testing.compaction_checker`).

* A compacted topic (:data:`TOPIC_SETTINGS`: ``cleanup_policy="compact"``,
  small segments, a cleaner that looks every few hundred milliseconds, a low
  dirty ratio and a short ``delete_retention_ms``), so that the cleaner runs
  many passes while the faults happen.
* :class:`CompactionWriter`: a producer thread (acks ``"all"``) that writes,
  per key of a bounded key set of its own (``"<name>-k<i>"``: one writer per
  key, so a key's write order is its writer's send order), values
  (``"<name>-<n>"``) and deletes (tombstones: a null value), recording each
  send's outcome as a ``send`` operation with ``id`` (``"<name>-<n>"``, for a
  delete too), ``value`` (None for a delete) and ``delete``.
* :class:`Scanner`: reads the whole topic from its log start with a raylog
  consumer, one ``scan`` operation per partition (``start``, ``end``: the
  position it reached, ``reads``: ``[[offset, key, value], ...]`` in the
  order received). The runner scans now and then during the run (so a
  removed record that comes back is seen) and once at the end, after the
  faults healed and the cleaner had ``delete_retention_ms`` and a few passes
  more. (A pass needs dirty data: meanwhile a writer ``churn`` writes values
  of keys of its own, and ``segment_ms`` rolls the segments, so that the
  writers' last deletes grow older than ``delete_retention_ms`` and passes
  still run, which remove them with the values they deleted.)
* :class:`CleanerWatch`: counts the cleaner's passes by asking every
  partition actor's ``stats()`` (``cleaner_passes``, per process: a restarted
  actor counts from 0 again) every few seconds.

Thread-safety: each class is driven by its own thread; ``start``/``stop``
from one other thread; :meth:`Scanner.scan` from one thread at a time.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from raylog.testing.history import FAILED, OK, Recorder
from raylog.testing.workload import ProducerWorker

log = logging.getLogger(__name__)

TOPIC = "compacted"

#: the compacted topic's settings: the cleaner runs many passes in a short run
TOPIC_SETTINGS = dict(
    cleanup_policy="compact",
    segment_bytes=16 * 1024,
    segment_ms=1000,
    max_message_bytes=16 * 1024,
    retention_check_ms=300,
    min_cleanable_dirty_ratio=0.01,
    min_compaction_lag_ms=0,
    delete_retention_ms=3000,
    flush_ms=20,
)
#: share of the writes that are deletes
DELETE_SHARE = 0.2


class CompactionWriter(ProducerWorker):
    """Writes values and deletes of ``keys`` keys of its own to ``topic``
    with acks ``"all"`` at ``rate`` sends a second."""

    def __init__(self, client, topic: str, name: str, history_dir: str, *, rate: float, seed: int, keys: int = 24,
                 delete_share: float = DELETE_SHARE):
        super().__init__(client, topic, name, history_dir, acks="all", keyed=True, rate=rate, seed=seed, keys=keys)
        self.delete_share = delete_share
        self._deletes: set[str] = set()

    def _send_one(self, n: int) -> None:
        label = f"{self.name}-{n}"
        key = f"{self.name}-k{self._rng.randrange(self.keys)}".encode()
        delete = self._rng.random() < self.delete_share
        if delete:
            self._deletes.add(label)
        t0 = time.time()
        try:
            fut = self.producer.send(self.topic, None if delete else label.encode(), key=key)
        except Exception as err:  # noqa: BLE001 - refused at once: not queued
            self._record(label, key, t0, FAILED, None, None, err)
            return
        self.sent += 1
        self._futures = True
        self._pending.append((label, key, t0, fut))

    def _record(self, value, key, t0, outcome, partition, offset, err) -> None:
        delete = value in self._deletes
        self._deletes.discard(value)
        self.outcomes[outcome] += 1
        self.recorder.record(
            "send", t0=t0, topic=self.topic, id=value, value=None if delete else value, delete=delete,
            key=key.decode(), acks="all", codec=None, outcome=outcome,
            partition=partition if outcome == OK else None, offset=offset if outcome == OK else None,
            error=None if err is None else f"{type(err).__name__}: {err}"[:300],
        )


class Scanner:
    """Reads every partition of ``topic`` from its log start to its high
    watermark and records what it read (one ``scan`` operation a partition)."""

    def __init__(self, client, topic: str, partitions: int, history_dir: str, name: str = "scanner"):
        self.client = client
        self.topic = topic
        self.partitions = partitions
        self.recorder = Recorder(os.path.join(history_dir, f"{name}.jsonl"), name)
        self.scans = 0

    def scan(self, *, final: bool = False, timeout_s: float = 60.0) -> list[dict]:
        """Scan every partition once; returns the partitions' summaries
        (``complete``: read up to the high watermark seen at the start)."""
        out = []
        for p in range(self.partitions):
            out.append(self._scan_partition(p, final, timeout_s))
        self.scans += 1
        return out

    def _scan_partition(self, p: int, final: bool, timeout_s: float) -> dict:
        t0 = time.time()
        reads: list = []
        start = position = end = None
        error = None
        consumer = None
        try:
            start, end = self.client.offsets(self.topic, p)
            consumer = self.client.consumer(self.topic, auto_offset_reset="earliest")
            consumer.assign([(self.topic, p)])
            consumer.seek(self.topic, p, start)
            position = start
            deadline = time.monotonic() + timeout_s
            while position < end and time.monotonic() < deadline:
                for m in consumer.poll(timeout_ms=500):
                    reads.append([m.offset, None if m.key is None else m.key.decode(),
                                  None if m.value is None else m.value.decode(errors="replace")])
                now = consumer.position(self.topic, p)
                if now is not None:
                    position = now
        except Exception as err:  # noqa: BLE001 - a partition away under a fault: what was read counts
            error = f"{type(err).__name__}: {err}"[:300]
        finally:
            if consumer is not None:
                try:
                    consumer.close()
                except Exception:  # noqa: BLE001
                    pass
        # what the scan covered: [start, reached); a read past it widens it
        reached = position if position is not None else start
        if reads and reached is not None:
            reached = max(reached, reads[-1][0] + 1)
        complete = end is not None and reached is not None and reached >= end
        self.recorder.record("scan", t0=t0, topic=self.topic, partition=p, start=start, end=reached, hw=end,
                             reads=reads, final=final, complete=complete, error=error)
        return {"partition": p, "reads": len(reads), "complete": complete, "error": error}

    def close(self) -> None:
        self.recorder.close()


class CleanerWatch:
    """Counts cleaner passes: every ``interval_s`` asks each partition's
    actor (every replica's, when the client can name them) for its
    ``cleaner_passes``; a process counts from 0, so the count is summed over
    the processes (pids) seen."""

    def __init__(self, client, topic: str, partitions: int, interval_s: float = 2.0):
        self.client = client
        self.topic = topic
        self.partitions = partitions
        self.interval_s = interval_s
        #: (partition, pid) -> the most passes that process reported
        self.seen: dict[tuple[int, int], int] = {}
        self.cleaned_here: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cleaner-watch", daemon=True)

    def start(self) -> "CleanerWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.poll()  # the last word

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        import ray  # heavy (Ray): imported when used

        for p in range(self.partitions):
            try:
                stats = ray.get(self.client.partition_actor(self.topic, p).stats.remote(), timeout=5)
            except Exception as err:  # noqa: BLE001 - an actor away under a fault: asked again later
                log.debug("cleaner watch: %s/%d: %s", self.topic, p, err)
                continue
            passes = stats.get("cleaner_passes")
            if passes is None:
                continue
            self.cleaned_here.add(p)
            key = (p, stats["pid"])
            self.seen[key] = max(self.seen.get(key, 0), passes)

    @property
    def passes(self) -> int:
        return sum(self.seen.values())

    def summary(self) -> dict:
        per = {}
        for (p, _pid), n in self.seen.items():
            per[p] = per.get(p, 0) + n
        return {"passes": self.passes, "per_partition": per, "processes": len(self.seen),
                "partitions_cleaned_by_their_actor": sorted(self.cleaned_here)}
