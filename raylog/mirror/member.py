"""A mirror member: a Ray actor in the target cluster that is a member of the
mirror's consumer group on the source (``mirror.<name>``) and copies the
partitions the group gives it (:class:`~raylog.mirror.copier.PartitionCopier`).

It reaches the source through its ZooKeeper address, cluster name and token
only (a :class:`raylog.Client` made from ZooKeeper alone: consumers fetch
over the data sockets, never through the source's Ray). Its loop, on a
thread of its own:

1. every ``scan_interval_s``, the source topics that match and whose target
   topic exists (the controller creates them); a change of that set makes
   a new consumer (the group rebalances);
2. poll; partitions newly assigned get a copier, which reads its progress
   record in the target's ZooKeeper and is sought to its position;
   partitions no longer assigned drop theirs;
3. hand each copier its message batches (``poll_batch``: uncompressed
   messages stay the fetched bytes, sent on as they are) and let it send its complete sets, each
   copier on a thread of a pool (:data:`PUMP_THREADS`): a set waits for
   the target's acknowledgement (its flush), and the partitions' waits
   overlap. While a copier is sending, its new messages wait in the
   member (ordered; never offered to a copier in the middle of a send);
   past :data:`HELD_MAX` of them its partition is paused in the source
   consumer, so one copier that retries a slow target holds back its own
   partition only, not the others;
4. every few seconds, commit the source group's offsets (a view of the
   progress for ``raylog groups describe`` on the source).

The source consumer reads ``read_committed``: the records of a source
transaction are copied once it commits, as plain records (the target holds
no transaction: what one transaction wrote to several partitions becomes
visible there partition by partition), those of an aborted transaction
never, and markers never. A partition with an open transaction is copied up
to its last stable offset and waits there.

An error of the loop is logged and the loop starts over from step 1 after
a pause (copiers restart from their records). Ray restarts a killed member
(``max_restarts=-1``); it resumes the same way.

Thread-safety: the loop's state is confined to its thread; a copier is
used by one thread at a time (the loop, or the pool thread sending for it,
never both); ``stats`` and ``stop`` only read or set thread-safe values.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

from raylog.config import EARLIEST
from raylog.errors import OffsetOutOfRangeError
from raylog.mirror import progress, spec as specs
from raylog.mirror.copier import LINGER_S, PartitionCopier

log = logging.getLogger(__name__)

COMMIT_INTERVAL_S = 2.0
ERROR_PAUSE_S = 1.0
#: copiers sending at once, per member
PUMP_THREADS = 8
#: messages held for a copier that is sending before its partition is paused
HELD_MAX = 40_000
#: the poll's wait while a copier is sending (its end is noticed this soon)
BUSY_POLL_MS = 20


def source_client(client_cls, spec):
    """A client of the source cluster from its ZooKeeper alone."""
    return client_cls(zookeeper=spec.source_zookeeper, cluster=spec.source_cluster, token=spec.source_token)


class MirrorMember:
    def __init__(self, spec, client_cls, target_kwargs: dict, index: int):
        self.spec = spec
        self.index = index
        self.target = client_cls(**target_kwargs)
        self.source = source_client(client_cls, spec)
        self._stop = threading.Event()
        self._sent = 0
        self._errors = 0
        self._last_error = ""
        self._thread = threading.Thread(target=self._run, name=f"mirror-{spec.name}-{index}", daemon=True)
        self._thread.start()

    def stats(self) -> dict:
        return {"index": self.index, "sent": self._sent, "errors": self._errors, "last_error": self._last_error,
                "alive": self._thread.is_alive()}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    # -- the loop ------------------------------------------------------------------

    def _topics(self) -> list[str]:
        return [t for t in self.source.list_topics()
                if self.spec.matches(t) and self.target.registry.topic_exists(self.spec.target_topic(t))]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve()
            except Exception as err:  # noqa: BLE001 - logged; the loop starts over
                self._errors += 1
                self._last_error = f"{type(err).__name__}: {err}"
                log.warning("mirror %s member %d: %s; starting over", self.spec.name, self.index, self._last_error)
                self._stop.wait(ERROR_PAUSE_S)

    def _serve(self) -> None:
        topics = self._topics()
        if not topics:
            self._stop.wait(min(self.spec.scan_interval_s, 5.0))
            return
        # read_committed: a transaction's records are copied once it commits (as plain records: the
        # target holds no transaction), an aborted one's never, markers never (docs/design.md §9)
        consumer = self.source.consumer(topics, group=self.spec.group, auto_offset_reset=EARLIEST,
                                        enable_auto_commit=False, session_timeout_ms=6000,
                                        isolation_level="read_committed",
                                        # batches from the first fetch on (the first poll_batch may
                                        # come after a fetch): every fetch keeps its stored bytes,
                                        # compressed wrappers whole
                                        fetch_batches=True)
        copiers: dict = {}
        sending: dict = {}  # tp -> Future of the copier's pump on the pool
        held: dict = {}  # tp -> message batches that came while its copier was sending
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=PUMP_THREADS,
                                                     thread_name_prefix=f"mirror-{self.spec.name}-send")
        try:
            next_scan = time.monotonic() + self.spec.scan_interval_s
            last_commit = time.monotonic()
            while not self._stop.is_set():
                # a set held for more messages is sent within its linger: poll no longer than that
                if sending:
                    wait_ms = BUSY_POLL_MS
                elif any(c.lingering for c in copiers.values()):
                    wait_ms = int(LINGER_S * 1000)
                else:
                    wait_ms = 300
                batches = consumer.poll_batch(timeout_ms=wait_ms, max_messages=20_000)
                self._collect(copiers, sending, held)
                fresh = self._follow_assignment(consumer, copiers, sending, held)
                for batch in batches:
                    held.setdefault((batch.topic, batch.partition), []).append(batch)
                for tp, copier in list(copiers.items()):
                    if tp in sending:
                        if (tp not in consumer.paused()
                                and sum(map(len, held.get(tp, ()))) > HELD_MAX):
                            consumer.pause([tp])  # resumed once its copier has taken them
                        continue
                    waiting = held.pop(tp, ())
                    if tp not in fresh:
                        for batch in waiting:
                            copier.offer_batch(batch)
                    if tp in consumer.paused():
                        consumer.resume([tp])
                    if copier.need_seek:
                        self._seek(consumer, tp, copier)
                    if copier.due():
                        sending[tp] = pool.submit(copier.pump)
                now = time.monotonic()
                if now - last_commit >= COMMIT_INTERVAL_S:
                    last_commit = now
                    try:
                        consumer.commit()
                    except Exception as err:  # noqa: BLE001 - a view only
                        log.debug("mirror %s: source commit failed: %s", self.spec.name, err)
                if now >= next_scan:
                    next_scan = now + self.spec.scan_interval_s
                    if sorted(self._topics()) != sorted(topics):
                        return  # a new consumer for the new set of topics
        finally:
            # the sends under way end first (each copier is used by one thread at a time)
            concurrent.futures.wait(list(sending.values()))
            pool.shutdown(wait=True)
            for copier in copiers.values():
                copier.close()
            consumer.close()

    def _collect(self, copiers: dict, sending: dict, held: dict) -> None:
        """Take the outcome of every send that ended: its count, or the
        copier dropped (another copier took its partition), or the loop's
        error (the loop starts over; copiers resume from their records)."""
        for tp, future in [(tp, f) for tp, f in sending.items() if f.done()]:
            del sending[tp]
            try:
                self._sent += future.result()
            except progress.LostPartition:
                log.info("mirror %s: %s-%d moved to another member", self.spec.name, *tp)
                copier = copiers.pop(tp, None)
                if copier is not None:
                    copier.close()
                held.pop(tp, None)

    def _follow_assignment(self, consumer, copiers: dict, sending: dict, held: dict) -> set:
        """Copiers for the partitions assigned now; the ones just made. A
        copier whose partition went elsewhere finishes its send first."""
        assigned = consumer.assignment()
        for tp in [tp for tp in copiers if tp not in assigned]:
            future = sending.pop(tp, None)
            if future is not None:
                try:
                    future.result()
                except Exception as err:  # noqa: BLE001 - no longer this member's partition
                    log.info("mirror %s: %s-%d: its last send before it moved: %s", self.spec.name, *tp, err)
            held.pop(tp, None)
            copiers.pop(tp).close()
        fresh = set()
        spec, cluster = self.spec, self.target.settings.cluster
        for tp in assigned:
            if tp in copiers:
                continue
            topic, partition = tp
            copier = PartitionCopier(
                zk=self.target._zk,
                target_metadata=self.target.metadata,
                progress_path=specs.progress_path(cluster, spec.name, topic, partition),
                checkpoints_path=specs.checkpoints_path(cluster, spec.name, topic, partition),
                topic=topic,
                partition=partition,
                target_topic=spec.target_topic(topic),
                producer_id=specs.producer_id(cluster, spec.name, spec.source_cluster, topic, partition),
                checkpoint_interval_s=spec.checkpoint_interval_s,
                stopping=self._stop,
            )
            copier.start()
            copier.need_seek = True
            copiers[tp] = copier
            fresh.add(tp)
        return fresh

    def _seek(self, consumer, tp, copier) -> None:
        earliest, latest = consumer.offsets(tp)
        target = copier.position if copier.position is not None else earliest
        if target < earliest:
            log.error("mirror %s: %s-%d lost [%d, %d) to the source's retention before it was mirrored",
                      self.spec.name, tp[0], tp[1], target, earliest)
            copier.skip_to(earliest)
            target = earliest
        try:
            consumer.seek(tp[0], tp[1], target)
        except OffsetOutOfRangeError:
            copier.need_seek = True
            return
        copier.sought(target)
