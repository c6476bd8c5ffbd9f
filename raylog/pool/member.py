"""A pool member: a Ray actor that is one real member of the pool's
consumer group (:class:`raylog.Consumer` with ``group``: the group code of
:mod:`raylog.groups`, cooperative rebalances included) and hands each
polled batch to the user's handler (:mod:`raylog.pool.handler`).

Its loop, on a thread of its own:

1. poll at most ``batch_max`` messages; split them by partition, keeping
   each partition's order;
2. per partition, call the handler with that partition's batch (retried
   with back-off); once it returns, the partition's **handled position**
   becomes the batch's last ``next_offset``; a partition whose handler
   failed ``max_handler_failures`` times in a row is **stopped**: it is
   paused in the consumer (``Consumer.pause``: no longer fetched), its
   handled position stays before the failed batch, and ``stats()`` shows
   the error; a member that gets it again after a rebalance starts over.
   With a ``dead_letter_topic`` the failed batch is produced there instead
   (keys, values and timestamps as they were, ``acks="all"``, sent before
   the position moves past it: at least once) and the partition goes on;
   only a batch that cannot be dead-lettered stops it;
3. every ``commit_interval_s``, commit the handled positions, and only
   them (docs/design.md section 6's commit rule, at least once: a position the
   handler has not returned from is never stored). A partition revoked by
   a rebalance is committed the same way inside ``on_revoked``, on this
   thread, before its owner node is released.

**Outputs** (``output_topic``; :mod:`raylog.pool.output`): what the
handler returns is produced there within step 2, before the position
moves (at least once). With ``exactly_once`` the consumer reads
``read_committed``, and each batch is one transaction of the partition's
own transactional producer: its outputs and its end position commit
together, so step 3 commits nothing (the transactions did). A partition
assigned gets its producer first (fencing its previous owner's), then is
read from the offset committed after that fence. A member fenced on a
partition (a newer owner made that producer) starts over with a new
consumer, as after any error of its loop.

The consumer is made with ``enable_auto_commit=False``; its own ``commit()``
would store every position it handed out, a stopped partition's too, so
the member commits the handled positions through the consumer's group
member, which refuses any partition the member does not own.

``stop()`` drains: the batch being handled finishes (a wait between
retries ends; that batch is not committed), the handled positions are
committed, the consumer leaves the group (its partitions move at once),
``teardown`` runs. Ray restarts a member that dies (``max_restarts=-1``):
the new one joins under a new consumer id; the old one's partitions move
when its ZooKeeper session ends (``session_timeout_ms``), and what it
handled after its last commit is handled again (at least once).

Thread-safety: the loop's state is confined to its thread, except the
counters ``stats()`` reads under ``_lock``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid

from raylog.errors import OffsetOutOfRangeError, RaylogError
from raylog.pool.handler import BatchAbandoned, HandlerRunner, retry_policy
from raylog.pool.output import AtLeastOnceOutput, ExactlyOnceOutput

log = logging.getLogger(__name__)

#: the window over which ``processed_per_s`` is measured
RATE_WINDOW_S = 10.0
#: the pause after an error of the loop before it starts over
ERROR_PAUSE_S = 1.0
#: a failed batch sent to the dead-letter topic must be stored within this long
DEAD_LETTER_TIMEOUT_S = 60.0


class _PartitionStats:
    """What one member knows of one partition it owns."""

    __slots__ = ("handled", "position", "committed", "errors", "last_error", "stopped", "dead_lettered")

    def __init__(self):
        self.handled = 0  # messages the handler returned from
        self.position = None  # offset after the last message handled
        self.committed = None  # the last position this member committed
        self.errors = 0  # handler failures, all told
        self.last_error = None  # the last HandlerFailure, as a dict
        self.stopped = False  # stopped at a batch the handler failed on
        self.dead_lettered = 0  # messages of failed batches sent to the dead-letter topic

    def public(self) -> dict:
        return {"handled": self.handled, "position": self.position, "committed": self.committed,
                "errors": self.errors, "last_error": self.last_error, "stopped": self.stopped,
                "dead_lettered": self.dead_lettered}


class PoolMember:
    """The member actor (see the module docstring); index ``index`` of the pool."""

    def __init__(self, spec, client_cls, client_kwargs: dict, index: int):
        self.spec = spec
        self.index = index
        self.consumer_id = f"pool-{spec.group}-{index}-{uuid.uuid4().hex[:8]}"
        self.client = client_cls(**client_kwargs)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._parts: dict = {}  # (topic, partition) -> _PartitionStats, for the partitions owned
        self._handled_total = 0
        self._rate = collections.deque()  # (monotonic time, messages handled), the last RATE_WINDOW_S
        self._last_error = ""
        self._started = time.time()
        self._started_mono = time.monotonic()
        self._consumer = None
        self._dead_letters = None  # the producer of the dead-letter topic, made at its first use
        self._output = None  # where the handler's outputs go (raylog.pool.output), with output_topic
        self._thread = threading.Thread(target=self._run, name=f"pool-{spec.group}-{index}", daemon=True)
        self._thread.start()

    # -- asked by the controller ---------------------------------------------------

    def ping(self) -> int:
        return self.index

    def stats(self) -> dict:
        """``{index, consumer_id, alive, partitions: {"topic-p": {...}}, handled,
        processed_per_s, last_error}``."""
        now = time.monotonic()
        consumer = self._consumer
        try:
            paused = consumer.paused() if consumer is not None else frozenset()
        except Exception:  # noqa: BLE001 - closed meanwhile: nothing is fetched
            paused = frozenset()
        with self._lock:
            rate = self._rate_now(now)
            parts = {f"{t}-{p}": {**s.public(), "fetching": (t, p) not in paused}
                     for (t, p), s in sorted(self._parts.items())}
            handled = self._handled_total
        return {"index": self.index, "consumer_id": self.consumer_id, "alive": self._thread.is_alive(),
                "partitions": parts, "handled": handled, "processed_per_s": rate, "last_error": self._last_error}

    def assignment(self) -> list[tuple[str, int]]:
        """The partitions this member holds now: from its consumer's assigned
        callback (the owner node taken) to its revoked callback (before the
        node is given up), as ``(topic, partition)`` pairs, sorted. What a
        check that no partition has two owners samples; it never waits for
        a poll in progress."""
        with self._lock:
            return sorted((topic, partition) for topic, partition in self._parts)

    def stop(self) -> dict:
        """Drain and leave the group (see the module docstring); the last stats."""
        self._stop.set()
        self._thread.join(timeout=self.spec.drain_timeout_s)
        try:
            self.client.close()
        except Exception as err:  # noqa: BLE001 - the member goes either way
            log.debug("pool %s member %d: closing its client: %s", self.spec.group, self.index, err)
        return self.stats()

    # -- the loop ------------------------------------------------------------------

    def _rate_now(self, now: float) -> float:
        while self._rate and now - self._rate[0][0] > RATE_WINDOW_S:
            self._rate.popleft()
        # a member younger than the window has run for less: its rate is over its own time
        window = min(RATE_WINDOW_S, max(1.0, now - self._started_mono))
        return sum(n for _, n in self._rate) / window

    def _run(self) -> None:
        spec = self.spec
        if spec.exactly_once:
            self._output = ExactlyOnceOutput(self.client, spec.output_topic, spec.group, spec.transaction_timeout_ms)
        elif spec.output_topic is not None:
            self._output = AtLeastOnceOutput(self.client, spec.output_topic)
        try:
            runner = HandlerRunner(self.spec.handler, retry_policy(self.spec), self._stop)
        except Exception as err:  # noqa: BLE001 - the user's setup: shown by status, the member idles
            self._last_error = f"handler setup failed: {type(err).__name__}: {err}"
            log.error("pool %s member %d: %s", self.spec.group, self.index, self._last_error)
            return
        try:
            while not self._stop.is_set():
                try:
                    self._serve(runner)
                except Exception as err:  # noqa: BLE001 - logged; the loop starts over with a new consumer
                    self._last_error = f"{type(err).__name__}: {err}"
                    log.warning("pool %s member %d: %s; starting over", self.spec.group, self.index,
                                self._last_error)
                    self._stop.wait(ERROR_PAUSE_S)
        finally:
            try:
                runner.teardown()
            except Exception as err:  # noqa: BLE001 - the user's teardown
                self._last_error = f"handler teardown failed: {type(err).__name__}: {err}"
            if self._dead_letters is not None:
                self._dead_letters.close()  # what it sent was waited for
            if self._output is not None:
                self._output.close()

    def _serve(self, runner: HandlerRunner) -> None:
        spec = self.spec
        consumer = self.client.consumer(
            list(spec.topics), group=spec.group, auto_offset_reset=spec.auto_offset_reset,
            enable_auto_commit=False, session_timeout_ms=spec.session_timeout_ms, consumer_id=self.consumer_id,
            isolation_level="read_committed" if spec.exactly_once else "read_uncommitted",
            on_assigned=lambda tps: self._on_assigned(consumer, tps),
            on_revoked=lambda tps: self._on_revoked(consumer, tps))
        self._consumer = consumer
        try:
            last_commit = time.monotonic()
            while not self._stop.is_set():
                messages = consumer.poll(timeout_ms=spec.poll_timeout_ms, max_messages=spec.batch_max)
                batches: dict = {}
                for m in messages:
                    batches.setdefault((m.topic, m.partition), []).append(m)
                for tp, batch in batches.items():
                    if not self._handle(runner, tp, batch):
                        break  # stopping: the rest of the poll is not handled
                    if self._parts[tp].stopped and tp not in consumer.paused():
                        consumer.pause([tp])  # not fetched any more: nothing of it is handled past the failure
                if time.monotonic() - last_commit >= spec.commit_interval_s:
                    last_commit = time.monotonic()
                    self._commit(consumer)
            self._commit(consumer)
        finally:
            consumer.close()  # on_revoked (on this thread) commits what was handled, then the member leaves
            self._consumer = None

    def _handle(self, runner: HandlerRunner, tp, batch: list) -> bool:
        """Hand one partition's batch to the handler; False when the member stops meanwhile."""
        with self._lock:
            part = self._parts.setdefault(tp, _PartitionStats())
            if part.stopped:
                return True  # a stopped partition's messages are not handled (nor committed)

        def failed(failure) -> None:
            with self._lock:
                part.errors += 1
                part.last_error = failure.public()

        around = None if self._output is None else (lambda call: self._output.run(tp, batch, call))
        try:
            failure = runner.run(batch, on_failure=failed, around=around)
        except InterruptedError:
            return False
        if failure is not None and self.spec.dead_letter_topic is not None:
            if self._dead_letter(tp, batch, failure):
                with self._lock:
                    part.dead_lettered += len(batch)
                    part.position = batch[-1].next_offset
                    if self.spec.exactly_once:
                        part.committed = part.position  # with the dead letters, in their transaction
                return True
        with self._lock:
            if failure is not None:
                part.stopped = True
                log.error("pool %s: %s-%d stopped at offset %d after %d handler failures: %s", self.spec.group,
                          tp[0], tp[1], failure.offset, failure.failures, failure.error)
                return True
            part.handled += len(batch)
            part.position = batch[-1].next_offset
            if self.spec.exactly_once:
                part.committed = part.position  # by the batch's transaction
            self._handled_total += len(batch)
            self._rate.append((time.monotonic(), len(batch)))
        return True

    def _dead_letter(self, tp, batch: list, failure) -> bool:
        """Send ``batch`` to the dead-letter topic and wait for it to be
        stored; False (the partition then stops) if that fails."""
        topic = self.spec.dead_letter_topic
        try:
            if self.spec.exactly_once:
                self._output.dead_letter(tp, batch, topic)  # with the batch's end position, in one transaction
            else:
                if self._dead_letters is None:
                    self._dead_letters = self.client.producer(acks="all")
                futures = [self._dead_letters.send(topic, m.value, m.key, timestamp_ms=m.timestamp) for m in batch]
                self._dead_letters.flush(timeout_s=DEAD_LETTER_TIMEOUT_S)
                for f in futures:
                    f.result(timeout_s=DEAD_LETTER_TIMEOUT_S)
        except BatchAbandoned:
            raise  # fenced: the partition is another member's now
        except Exception as err:  # noqa: BLE001 - the partition stops instead: nothing is skipped
            log.error("pool %s: %s-%d: the batch at offset %d could not be sent to dead-letter topic %r (%s); "
                      "the partition stops", self.spec.group, tp[0], tp[1], failure.offset, topic, err)
            return False
        log.warning("pool %s: %s-%d: %d messages from offset %d sent to dead-letter topic %r after %d handler "
                    "failures: %s", self.spec.group, tp[0], tp[1], len(batch), failure.offset, topic,
                    failure.failures, failure.error)
        return True

    # -- commits (docs/design.md section 6: only what the handler returned from) ---------

    def _commit(self, consumer, only=None) -> None:
        if self.spec.exactly_once:
            return  # each batch's transaction committed its position
        member = consumer._member  # the consumer's group member: commits exactly the positions given
        owned = member.owned
        with self._lock:
            positions = {tp: s.position for tp, s in self._parts.items()
                         if s.position is not None and s.position != s.committed and tp in owned
                         and (only is None or tp in only)}
        if not positions:
            return
        try:
            member.commit(positions)
        except RaylogError as err:
            # Disconnected or the session lost: tried again at the next interval;
            # a partition that moved meanwhile is handled again by its next owner.
            log.info("pool %s member %d: commit of %s failed: %s", self.spec.group, self.index,
                     sorted(positions), err)
            return
        with self._lock:
            for tp, offset in positions.items():
                if tp in self._parts:
                    self._parts[tp].committed = offset

    def _on_assigned(self, consumer, partitions) -> None:
        """On this thread, before any message of ``partitions`` is handed
        out. Exactly once: each partition's transactional producer first
        (fencing the partition's previous owner and settling its last
        transaction), then the partition is read from the offset committed
        now (its fetcher's start was read before the fence)."""
        with self._lock:
            for tp in partitions:
                self._parts.setdefault(tp, _PartitionStats())
        if not self.spec.exactly_once:
            return
        for tp in sorted(partitions):
            self._output.open(tp)
            committed = consumer.committed(tp)
            if committed is not None:
                try:
                    consumer.seek(tp[0], tp[1], committed)
                except OffsetOutOfRangeError:
                    pass  # gone to retention: the fetcher's reset stands (auto_offset_reset)
            with self._lock:
                self._parts[tp].committed = committed

    def _on_revoked(self, consumer, partitions) -> None:
        """On this thread, the partitions still owned: commit what was handled of them, forget them."""
        self._commit(consumer, only=frozenset(partitions))
        with self._lock:
            for tp in partitions:
                self._parts.pop(tp, None)
        if self._output is not None:
            for tp in partitions:
                self._output.release(tp)
