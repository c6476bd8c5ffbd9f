"""The accumulator: messages gathered into one open batch per topic-partition.

A batch opens with its first message and is **sealed** (handed to the
sender) when it holds ``batch_size`` messages, when the next message would
take its message set past the topic's ``max_message_bytes``, or when it is
``linger_ms`` old, whichever comes first; ``flush`` seals everything. The
linger clock starts when the batch opens: opening a batch wakes the sender
if the batch's deadline comes before the sender's next wake-up, so a lone
message on an idle producer leaves after ``linger_ms``, not when a batch
fills (every path: keyless, keyed, explicit partition, producer actor,
audit events).

Keyless messages stick to one partition per topic until their batch is
sealed (:class:`~raylog.producer.partitioner.StickyPartitioner`); keyed
messages go to ``crc32c(key) mod partitions`` (or the producer's chosen key
hash: :data:`raylog.producer.partitioner.PARTITIONERS`).

Sealed batches wait in a queue per topic-partition, in order, until the
sender takes them. ``buffered`` counts messages accepted and not yet
resolved; a caller blocks while it is at ``max_buffered_messages``.

Thread-safety: every field is guarded by :attr:`RecordAccumulator.lock`.

The boundary with the sender (after aiokafka's ``RecordAccumulator``:
``ready`` / ``drain``) is four calls and one flag, listed in
:data:`SENDER_INTERFACE`; the sender touches nothing else of the
accumulator (tests/producer/test_accumulator_interface.py checks it):

* :meth:`~RecordAccumulator.wait_ready` (the dispatcher) blocks until
  topic-partitions have sealed batches no worker holds, sealing the
  batches whose linger is over on the way, and hands them out;
* :meth:`~RecordAccumulator.drain` (a worker) takes the next batches of a
  partition it was handed, in order, and gives the partition back when
  none are left;
* :meth:`~RecordAccumulator.in_flight_batches` lists the batches workers
  hold (for flush and close);
* :meth:`~RecordAccumulator.wake_sender` ends the dispatcher's wait (at
  close);
* :attr:`~RecordAccumulator.closed` is read, never written, by the sender;
* the direct round (below): :meth:`~RecordAccumulator.take_direct`,
  :meth:`~RecordAccumulator.release_direct` and
  :meth:`~RecordAccumulator.hand_over`.

The direct round (acks 1 and "all", ``batch_size`` 1): a message whose
partition has nothing queued, nothing in flight and no worker is sent by
the caller's own thread (:meth:`~RecordAccumulator.append_direct` returns a
:class:`DirectClaim` with the partition reserved to it; the sender writes
the set), and its reply is read by the first thread that waits for its
future without a timeout (the caller's ``result()``, or ``flush``): no
hand-off to the sender's threads on the way out or back. Until then the
claim stands in for a worker: nothing else is sent to that partition.
:meth:`wait_ready` hands a claimed partition to a worker (which reads the
reply, retries if need be and goes on with what came after, in order) as
soon as another batch queues behind it, when the claim is handed over
(a wait with a timeout, a future polled with ``done()`` or given a
callback, a write that failed, an error reply), at close, and at any
wake of the dispatcher from :data:`DIRECT_GRACE_S` after the claim on: so
a future nobody waits for is resolved all the same.

Many messages per call: ``send_batch``, ``send_many``, the producer actor
and audit events come through :meth:`~RecordAccumulator.append_many`. A
keyless call (or one to a given partition) fills batches a slice at a time;
a keyed one is split by partition first (``crc32c(key) mod partitions``, one
compiled pass when built) and each group joins its partition's open batch
whole when it fits. Either way the call holds the lock throughout and wakes
the sender at most once, as it lets go of the lock (a sender woken earlier
would only wait for the lock the call holds).

The compiled send (``raylog.producer._fastsend.KeylessSend``) is given
:meth:`~RecordAccumulator.compiled_send_view` and uses nothing else: a
:class:`CompiledSendView` names each container it reads or writes.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, NamedTuple, Sequence

from raylog.errors import ClosedError, RequestTimeoutError
from raylog.producer.batch import ProducerBatch, add_key_size, batch_limit, headers_size
from raylog.producer.futures import BatchFuture, CallFuture, SendFuture
from raylog.producer.partitioner import StickyPartitioner, group_by_partition, partition_for_key
from raylog.storage.message import HEADER_SIZE

_new_object = object.__new__

#: how long a caller waits for buffer space before RequestTimeoutError
DEFAULT_MAX_BLOCK_S = 60.0

#: what the sender may use of the accumulator (see the module docstring)
SENDER_INTERFACE = frozenset({
    "wait_ready", "drain", "in_flight_batches", "wake_sender", "closed", "take_direct", "release_direct", "hand_over",
})

#: a direct round nobody has waited for goes to a worker at the dispatcher's
#: first wake this long after its claim (a backstop: a callback or a poll
#: hands it over at once)
DIRECT_GRACE_S = 0.005


class DirectClaim:
    """A partition reserved to one set sent by its caller's thread (see
    "The direct round" above).

    Thread-safety: :meth:`hold` / :meth:`let_go` (or ``with claim:``) is a
    lock held while the set is written and while its reply is read, by one
    thread at a time; the sender's state of the round (:meth:`attach`,
    :attr:`round`, the accumulator never reads it) and :meth:`set_reading`
    are used by that thread only. ``due`` and ``reading`` are read under
    the accumulator's lock."""

    __slots__ = ("batch", "since", "due", "reading", "_lock", "_round")

    def __init__(self, batch: ProducerBatch, since: float):
        self.batch = batch  # the one batch it carries (read only)
        self.since = since
        self.due = False  # handed over: a worker takes it at once
        self.reading = False  # a waiting thread reads its reply (no backstop needed)
        self._lock = threading.Lock()
        self._round = None

    def hold(self, blocking: bool = True) -> bool:
        """Take the claim's lock (False: another thread holds it and ``blocking`` is False)."""
        return self._lock.acquire(blocking)

    def let_go(self) -> None:
        """Release the claim's lock."""
        self._lock.release()

    def __enter__(self) -> "DirectClaim":
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def attach(self, state) -> None:
        """The sender's state of the round (lock held)."""
        self._round = state

    @property
    def round(self):
        """What :meth:`attach` set, or None before the round was started."""
        return self._round

    def set_reading(self, reading: bool) -> None:
        """A waiting thread reads (True) or stopped reading (False) the reply."""
        self.reading = reading


class CompiledSendView(NamedTuple):
    """What the compiled send may read and write of an accumulator, by name
    (its fast path appends without the lock while the lock is free: see
    raylog/producer/_fastsend.c). Every container is the accumulator's own,
    shared, not a copy."""

    #: the lock's ``locked()``: the fast path runs only while it answers False
    locked: Callable[[], bool]
    #: the accumulator's attribute dict: ``closed`` and ``sender_waiting``
    #: (bools) are read, ``buffered`` (an int) is read and incremented, and a
    #: key ``on_seal`` (an owner's hook, set on the instance) turns the fast
    #: path of batches of one off
    fields: dict
    #: topic -> its open sticky batch (read; values and size appended to)
    keyless: dict
    #: topic -> its partition count (read)
    partition_counts: dict
    #: topic -> its max_message_bytes (read)
    limits: dict
    #: (topic, partition) -> deque of sealed batches (appended to)
    ready: dict
    #: (topic, partition) -> the batches a worker holds (read)
    draining: dict
    compressed: bool
    batch_size: int
    max_buffered: int


class RecordAccumulator:
    """Open and sealed batches (see the module docstring). A topic's
    partition count and ``max_message_bytes`` come from ``metadata`` once
    and are cached here."""

    def __init__(
        self,
        metadata,
        *,
        batch_size: int,
        linger_ms: float,
        compression: str | None,
        max_buffered_messages: int,
        max_block_s: float = DEFAULT_MAX_BLOCK_S,
        key_partition=partition_for_key,
    ):
        self._metadata = metadata
        #: key, partition count -> partition (raylog.producer.partitioner.PARTITIONERS)
        self.key_partition = key_partition
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000.0
        self.compressed = compression is not None
        self.max_buffered = max_buffered_messages
        self.max_block_s = max_block_s

        self.lock = threading.Lock()
        #: the sender waits here for sealed batches and linger deadlines
        self.wake = threading.Condition(self.lock)
        #: callers wait here for buffer space
        self.space = threading.Condition(self.lock)
        #: open batches by topic-partition
        self.open: dict[tuple[str, int], ProducerBatch] = {}
        self.keyless: dict[str, ProducerBatch] = {}  # the open sticky batch of each topic
        self.ready: dict[tuple[str, int], collections.deque[ProducerBatch]] = {}
        #: topic-partitions a sender worker is draining, with the batches it holds
        self.draining: dict[tuple[str, int], list[ProducerBatch]] = {}
        #: topic-partitions reserved to a direct round (sent by a caller's thread)
        self.direct: dict[tuple[str, int], DirectClaim] = {}
        self.buffered = 0
        self.closed = False
        #: whether the sender waits on :attr:`wake`, and until when (monotonic;
        #: inf: until notified)
        self.sender_waiting = False
        #: inside a call that wakes the sender once, as it lets go of the lock
        self.deferring = False
        self.wake_deferred = False
        self.sender_wakes_at = float("inf")
        self._sticky = StickyPartitioner()
        self._counts: dict[str, int] = {}
        self._limits: dict[str, int] = {}

    # -- the sender's interface (see the module docstring) ---------------------

    def wait_ready(self, until: float | None = None) -> list[tuple[str, int]] | None:
        """Block until topic-partitions have sealed batches that no worker
        holds, and return them: each is then the caller's to :meth:`drain`
        until that gives it back. Batches whose linger is over are sealed on
        the way; the wait ends at the earliest deadline of the open ones, or
        at ``until`` (monotonic seconds; ``[]`` is returned then) unless the
        accumulator is closed. ``None`` once closed with nothing left open,
        sealed or held: the sender may stop."""
        with self.lock:
            while True:
                now = time.monotonic()
                earliest = self.seal_expired(now)
                due = [tp for tp, queue in self.ready.items() if queue and tp not in self.draining]
                for tp, claim in self.direct.items():
                    if tp in self.draining:  # handed out already: its worker takes it
                        continue
                    taken_at = claim.since + DIRECT_GRACE_S
                    if claim.reading and not (claim.due or self.closed or self.ready.get(tp)):
                        continue  # its reply is being read: released when it comes
                    if claim.due or self.closed or now >= taken_at:
                        if tp not in due:
                            due.append(tp)
                    elif taken_at < earliest:
                        earliest = taken_at
                if due:
                    break
                if (self.closed and not self.open and not self.draining and not self.direct
                        and not any(self.ready.values())):
                    self.sender_wakes_at = float("inf")
                    return None
                wake = earliest
                if until is not None and not self.closed:
                    if now >= until:
                        break
                    wake = min(earliest, until)
                self.sender_wakes_at = wake
                self.sender_waiting = True
                self.wake.wait(None if wake == float("inf") else max(0.0, wake - now))
                self.sender_waiting = False
            self.sender_wakes_at = now
            for tp in due:
                self.draining[tp] = []
            return due

    def drain(self, tp: tuple[str, int], max_batches: int) -> list[ProducerBatch]:
        """The next sealed batches of ``tp`` (at most ``max_batches``, in
        order), for the worker :meth:`wait_ready` handed ``tp`` to; they
        count as in flight until its next call. ``[]`` when none are left:
        ``tp`` is given back (and callers waiting for space are woken)."""
        with self.lock:
            queue = self.ready.get(tp)
            if not queue:
                self.ready.pop(tp, None)
                del self.draining[tp]
                self.wake.notify()  # the dispatcher may be waiting to close
                self.space.notify_all()
                return []
            batches = [queue.popleft() for _ in range(min(max_batches, len(queue)))]
            self.draining[tp] = batches
            return batches

    def in_flight_batches(self) -> list[ProducerBatch]:
        """The batches workers and direct rounds hold (lock held by the caller)."""
        return [b for batches in self.draining.values() for b in batches] + [
            c.batch for c in self.direct.values()
        ]

    def take_direct(self, tp: tuple[str, int]) -> DirectClaim | None:
        """For the worker :meth:`wait_ready` handed ``tp`` to: the direct
        round it must finish first (its batch then counts as the worker's
        until its next :meth:`drain`), or None."""
        with self.lock:
            claim = self.direct.pop(tp, None)
            if claim is not None:
                self.draining[tp] = [claim.batch]
            return claim

    def release_direct(self, tp: tuple[str, int], claim: DirectClaim) -> None:
        """A direct round finished by the thread that read its reply: the
        partition is free again (unless a worker has taken it over: then it
        stays that worker's); batches queued behind it go to a worker."""
        with self.lock:
            if self.direct.get(tp) is claim:
                del self.direct[tp]
                if self.ready.get(tp) and self.sender_waiting:
                    self.wake.notify()
            self.space.notify_all()

    def hand_over(self, tp: tuple[str, int], claim: DirectClaim) -> None:
        """Let a worker finish a direct round now (its reply is not read on
        the caller's thread)."""
        with self.lock:
            if self.direct.get(tp) is claim and not claim.due:
                claim.due = True
                self.wake.notify()

    def wake_sender(self) -> None:
        """End the dispatcher's wait now (it then sees :attr:`closed`)."""
        with self.lock:
            self.wake.notify_all()

    def compiled_send_view(self) -> CompiledSendView:
        """The containers the compiled send works on (:class:`CompiledSendView`)."""
        return CompiledSendView(
            locked=self.lock.locked,
            fields=vars(self),
            keyless=self.keyless,
            partition_counts=self._counts,
            limits=self._limits,
            ready=self.ready,
            draining=self.draining,
            compressed=self.compressed,
            batch_size=self.batch_size,
            max_buffered=self.max_buffered,
        )

    # -- topic facts (cached; metadata calls happen outside the lock) ----------

    def partitions(self, topic: str) -> int:
        count = self._counts.get(topic)
        if count is None:
            count = self._counts[topic] = self._metadata.partitions(topic)
            self._limits[topic] = batch_limit(self._metadata.config(topic).max_message_bytes)
        return count

    def partitions_changed(self, topic: str, count: int) -> None:
        """A topic's partition count changed (``client.add_partitions``;
        the metadata's callback, on kazoo's thread): keys map over the new
        count from the next message on (the compiled send reads the same dict)."""
        if topic in self._counts:
            self._counts[topic] = count

    # -- appending ------------------------------------------------------------------

    def append(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int | None = None,
               timestamp_ms: int | None = None, headers: list | None = None) -> SendFuture:
        """One message (keyless ones join the topic's sticky batch); a
        ``None`` value is a tombstone; ``headers`` a list of ``(str, bytes | None)``."""
        if key is None and partition is None and timestamp_ms is None and not headers and value is not None:
            return self.append_keyless(topic, value)
        count = self._counts.get(topic) or self.partitions(topic)
        grow = HEADER_SIZE + (len(value) if value is not None else 0)
        if headers:
            grow += headers_size(headers)
        if partition is None and key is not None:
            partition = self.key_partition(key, count)
        if key is not None:
            grow += len(key)
        with self.lock:
            self._wait_for_space()
            sticky = partition is None
            if sticky:
                partition = self._sticky.partition(topic, count)
            batch = self._batch_for(topic, partition, grow)
            if sticky:
                self.keyless[topic] = batch
            values = batch.values
            index = len(values)
            if key is not None and batch.keys is None:
                batch.keys = [None] * index
            values.append(value)
            if batch.keys is not None:
                batch.keys.append(key)
            if timestamp_ms is not None:
                if batch.timestamps is None:
                    batch.timestamps = [int(batch.created * 1000)] * index
                batch.timestamps.append(timestamp_ms)
            elif batch.timestamps is not None:
                batch.timestamps.append(int(batch.created * 1000))
            if headers:
                if batch.headers is None:
                    batch.headers = {}
                batch.headers[index] = headers
            batch.size += grow
            self.buffered += 1
            if index + 1 >= self.batch_size:
                self._seal(batch)
            return SendFuture(batch.future, index)

    def append_keyless(self, topic: str, value: bytes) -> SendFuture:
        """A keyless message without partition or timestamp: the hot path of
        ``send``. The open sticky batch of the topic takes it; a new batch
        is opened only when there is none, it is full or it carries keys or
        timestamps."""
        if self.batch_size == 1:
            return self.append_alone(topic, value)
        grow = HEADER_SIZE + len(value)
        lock = self.lock
        lock.acquire()
        try:
            batch = self.keyless.get(topic)
            if (
                batch is None
                or batch.keys is not None
                or batch.timestamps is not None
                or self.buffered >= self.max_buffered
                or batch.size + grow > batch.limit
            ):
                batch = self._open_keyless(topic, grow)
            values = batch.values
            index = len(values)
            values.append(value)
            batch.size += grow
            self.buffered += 1
            if index + 1 >= self.batch_size:
                self._seal(batch)
            # (SendFuture(batch.future, index) without the cost of __init__)
            future = _new_object(SendFuture)
            future._batch = batch.future
            future._index = index
            return future
        finally:
            lock.release()

    def _open_keyless(self, topic: str, grow: int) -> ProducerBatch:
        """The topic's sticky batch with room for ``grow`` more bytes (lock
        held), its keys or timestamps extended for the message to come."""
        count = self._counts.get(topic)
        if count is None:
            self.lock.release()  # (no metadata call under the lock)
            try:
                count = self.partitions(topic)
            finally:
                self.lock.acquire()
        self._wait_for_space()
        batch = self._batch_for(topic, self._sticky.partition(topic, count), grow)
        self.keyless[topic] = batch
        if batch.keys is not None:
            batch.keys.append(None)
        if batch.timestamps is not None:
            batch.timestamps.append(int(batch.created * 1000))
        return batch

    def append_alone(self, topic: str, value: bytes) -> SendFuture:
        """A keyless message with ``batch_size`` 1 (the caller checks): its
        batch is sealed as it is made (no batch is ever open then), straight
        into the ready queue."""
        return self._append_sealed(topic, value, direct=False)[0]

    def append_direct(self, topic: str, value: bytes) -> tuple[SendFuture, DirectClaim | None]:
        """:meth:`append_alone` for the direct round: when the partition has
        nothing queued, in flight or claimed, the batch is not queued but
        claimed: the :class:`DirectClaim` comes back, its lock held, for the
        caller to send (see "The direct round" above); else ``None``."""
        return self._append_sealed(topic, value, direct=True)

    def _append_sealed(self, topic: str, value: bytes, direct: bool) -> tuple[SendFuture, DirectClaim | None]:
        """One message in a batch of its own, sealed at once: queued, or
        (``direct``, the partition idle) claimed for the caller's thread."""
        count = self._counts.get(topic) or self.partitions(topic)
        with self.lock:
            if self.closed or self.buffered >= self.max_buffered:
                self._wait_for_space()
            partition = self._sticky.partition(topic, count) if count > 1 else 0
            batch = ProducerBatch(topic, partition, None, self._limits[topic], self.compressed, [value])
            batch.size = HEADER_SIZE + len(value)
            self.buffered += 1
            tp = (topic, partition)
            claim = None
            queue = self.ready.get(tp)
            if direct and not queue and tp not in self.draining and tp not in self.direct:
                claim = self.direct[tp] = DirectClaim(batch, time.monotonic())
                claim.hold()
                if queue is None:  # (the compiled send appends to the queue it finds)
                    self.ready[tp] = collections.deque()
            else:
                if queue is None:
                    queue = self.ready[tp] = collections.deque()
                queue.append(batch)
                if self.sender_waiting and tp not in self.draining:
                    self.wake.notify()
            self.on_seal(batch)
            if count > 1:
                self._sticky.batch_sent(topic, count)
            return SendFuture(batch.future, 0), claim

    def _batch_for(self, topic: str, partition: int, grow: int) -> ProducerBatch:
        """The open batch of the topic-partition with room for ``grow`` more
        bytes, sealing the open one if it has not (lock held)."""
        batch = self.open.get((topic, partition))
        if batch is not None and batch.values and batch.size + grow > batch.limit:
            self._seal(batch)
            batch = None
        if batch is None:
            limit = self._limits.get(topic) or batch_limit(self._metadata.config(topic).max_message_bytes)
            batch = ProducerBatch(topic, partition, self.linger_s, limit, self.compressed)
            self.open[(topic, partition)] = batch
            if self.sender_waiting and batch.deadline < self.sender_wakes_at and self.batch_size > 1:
                # The sender sleeps past this batch's linger: wake it (a batch of
                # one is sealed at once, which wakes it anyway).
                self._wake_sender()
        return batch

    def _wake_sender(self) -> None:
        if self.deferring:
            self.wake_deferred = True
        else:
            self.wake.notify()

    def _end_deferring(self) -> None:
        """Wake the sender if a deferred call would have (lock held)."""
        self.deferring = False
        if self.wake_deferred:
            self.wake_deferred = False
            self.wake.notify()

    def _wait_for_space(self) -> None:
        if self.closed:
            raise ClosedError("the producer is closed; create a new one with client.producer()")
        if self.buffered < self.max_buffered:
            return
        self.seal_all()
        self._end_deferring()  # (the sender must send while this caller waits)
        deadline = time.monotonic() + self.max_block_s
        while self.buffered >= self.max_buffered and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeoutError(
                    f"{self.buffered} messages still buffered after {self.max_block_s} s (the limit is "
                    f"{self.max_buffered}); is the cluster reachable?"
                )
            self.space.wait(min(left, 1.0))
        if self.closed:
            raise ClosedError("the producer was closed while waiting for buffer space")

    # -- sealing (lock held) ----------------------------------------------------

    def _seal(self, batch: ProducerBatch) -> None:
        del self.open[(batch.topic, batch.partition)]
        if batch.keys is not None:
            batch.future.set_keys(batch.keys)
        if self.keyless.get(batch.topic) is batch:
            del self.keyless[batch.topic]
            self._sticky.batch_sent(batch.topic, self._counts.get(batch.topic, 1))
        queue = self.ready.get((batch.topic, batch.partition))
        if queue is None:
            queue = self.ready[(batch.topic, batch.partition)] = collections.deque()
        queue.append(batch)
        self.on_seal(batch)
        if self.sender_waiting and (batch.topic, batch.partition) not in self.draining:
            self._wake_sender()  # (a worker draining the partition takes it without the sender)

    def on_seal(self, batch: ProducerBatch) -> None:
        """Hook for the owner (audit counts), called with the lock held."""

    def seal_all(self) -> None:
        for batch in list(self.open.values()):
            self._seal(batch)

    def seal_expired(self, now: float) -> float:
        """Seal the batches whose linger is over; the earliest deadline of
        those still open (inf if none)."""
        earliest = float("inf")
        for batch in list(self.open.values()):
            if batch.deadline <= now:
                self._seal(batch)
            elif batch.deadline < earliest:
                earliest = batch.deadline
        return earliest

    def pending_futures(self) -> list[BatchFuture]:
        """The futures of every batch not resolved yet that is open or sealed
        and waiting (the sender adds those in flight)."""
        futures = [b.future for b in self.open.values()]
        for queue in self.ready.values():
            futures.extend(b.future for b in queue)
        return futures

    # -- many messages per call (send_batch, send_many, the producer actor, audit events) --

    def append_many(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None,
        partition: int | None,
        check=None,
    ) -> CallFuture:
        """Many messages at once, each partitioned by its key (or all to
        ``partition``, or keyless and sticky); batches fill a slice at a
        time, without a per-message lookup of the open batch. ``check``
        (values, keys), when given, is called before keyed messages are
        grouped by the reference (the compiled grouping checks their types
        itself)."""
        call = CallFuture()
        n = len(values)
        if not n:
            return call
        count = self._counts.get(topic) or self.partitions(topic)
        if keys is None or partition is not None:
            sizes = list(map(len, values)) if keys is None else list(map(add_key_size, map(len, values), keys))
            with self.lock:
                self.deferring = True
                try:
                    self._fill(topic, partition, values, keys, sizes, 0, count, call)
                finally:
                    self._end_deferring()
            return call
        # Keyed: split the call by partition (crc32c(key) mod partitions),
        # keeping the call's order within each; one compiled pass when built.
        groups = group_by_partition(values, keys, count, check, self.key_partition)
        with self.lock:
            self.deferring = True
            try:
                self._append_groups(topic, groups, n, count, call)
            finally:
                self._end_deferring()
        call._count = n  # (_fill counted its own: now all n are in)
        return call

    #: the compiled common case of :meth:`_append_groups` (``_fastsend.GroupFill``),
    #: set by the producer when built; ``None``: this Python code alone
    fill_groups = None

    def _append_groups(self, topic, groups, n, count, call: CallFuture) -> None:
        """The groups of a keyed call into their partitions' batches (lock held)."""
        batch_size = self.batch_size
        parts = call._parts
        taken = 0  # messages of the fast path, not yet counted in buffered
        # Buffer room for the whole call: then no group needs its own check.
        room = not self.closed and self.buffered + n < self.max_buffered
        fill = self.fill_groups if room else None
        i = 0
        while i < len(groups):
            if fill is not None:
                # compiled: the groups from i on into their open batches, up
                # to one it leaves (or what is left of it) for the code below
                placed, i = fill(groups, i, self.open, topic, batch_size, HEADER_SIZE, parts, self._seal,
                                 self._open_keyed)
                self.buffered += placed
                if i == len(groups):
                    break
            p, positions, group_values, group_keys, total, largest = groups[i]
            i += 1
            k = len(positions)
            if room and p >= 0:
                batch = self.open.get((topic, p))
                if batch is None:
                    batch = self._open_keyed(topic, p)
                first = len(batch.values)
                if (
                    first + k <= batch_size
                    and batch.keys is not None
                    and batch.timestamps is None
                    and batch.size + k * (HEADER_SIZE + largest) <= batch.limit
                ):
                    # the common case: the open batch takes the whole group
                    parts.append((batch.future, first, k, positions))
                    batch.values += group_values
                    batch.keys += group_keys
                    batch.size += k * HEADER_SIZE + total
                    taken += k
                    if first + k == batch_size:
                        self._seal(batch)
                    continue
            self.buffered += taken
            taken = 0
            sizes = list(map(add_key_size, map(len, group_values), group_keys))
            self._fill(topic, None if p < 0 else p, group_values, group_keys, sizes, positions, count, call)
        self.buffered += taken

    def _open_keyed(self, topic: str, partition: int):
        """A new open batch of the topic-partition, for keyed messages (lock held)."""
        batch = self._batch_for(topic, partition, 0)
        batch.keys = []
        return batch

    def _fill(self, topic, partition, values, keys, sizes, positions, count, call: CallFuture) -> None:
        """Put ``values`` (with ``keys`` and their ``sizes`` without headers)
        into batches of ``partition`` (sticky when ``None``), a slice per
        batch; ``positions`` are their places in the call (a list, or the
        first place when consecutive). Lock held."""
        start, total = 0, len(values)
        largest = HEADER_SIZE + max(sizes)
        while start < total:
            self._wait_for_space()
            sticky = partition is None
            p = self._sticky.partition(topic, count) if sticky else partition
            batch = self._batch_for(topic, p, HEADER_SIZE + sizes[start])
            if sticky:
                self.keyless[topic] = batch
            room = max(1, min(self.batch_size - len(batch.values), total - start, self.max_buffered - self.buffered))
            size = batch.size
            if size + room * largest <= batch.limit:
                take = room  # the common case: it all fits, no per-message check
                size += room * HEADER_SIZE + sum(sizes[start : start + room])
            else:
                take = 0
                while take < room:
                    grow = HEADER_SIZE + sizes[start + take]
                    if take and size + grow > batch.limit:
                        break
                    size += grow
                    take += 1
            end = start + take
            first = len(batch.values)
            batch.values.extend(values[start:end])
            if keys is not None or batch.keys is not None:
                if batch.keys is None:
                    batch.keys = [None] * first
                batch.keys.extend(keys[start:end] if keys is not None else [None] * take)
            if batch.timestamps is not None:
                batch.timestamps.extend([int(batch.created * 1000)] * take)
            batch.size = size
            self.buffered += take
            call._add(batch.future, first, take, positions + start if isinstance(positions, int) else positions[start:end])
            start = end
            if len(batch.values) >= self.batch_size or start < total:
                self._seal(batch)
