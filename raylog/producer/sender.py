"""The sender: takes sealed batches to their partitions and resolves their futures.

One dispatcher thread waits for sealed batches and for linger deadlines
(it sleeps until the earliest open batch is due, and the accumulator wakes
it when a batch opens with an earlier deadline). Each topic-partition with
sealed batches is then **drained** by a worker of a bounded pool
(``max_in_flight_partitions`` threads): requests to different partitions
are in flight at once, and one partition's retries hold no other back.
A partition is drained by at most one worker at a time, so its sets leave
in order, on its own connection.

A drain sends up to ``max_in_flight_sets`` (16) sets per round, pipelined on
one connection, and reads a reply per set (acks 1 or "all"; with acks=0 a
round takes up to :data:`MAX_UNACKED_ROUND_SETS`):

* a base offset resolves the batch's future;
* a typed error the server answered for one set fails that set alone
  (its future raises it, naming the topic-partition) unless it is
  retriable;
* a failure of the connection itself, or a retriable reply, resends every
  set of the round not yet acknowledged, in order, under the producer's
  :class:`~raylog.retry.RetryPolicy` (bounded tries and a deadline); when
  the policy gives up, those sets fail with the last error. The deadline
  counts from each batch's creation (Kafka's ``delivery.timeout.ms``): a
  partition that stays away fails its queued batches once they are due,
  after one more try each, rather than granting every one a deadline of
  its own. An endpoint that refuses the connection because it is full
  (TooManyConnectionsError) is tried again until that deadline, whatever
  the policy's count of tries. Closing the producer abandons what is
  still being retried: it fails with :class:`~raylog.errors.ClosedError`
  (outcome unknown); so does the stop at interpreter exit, once the
  delivery deadline has passed (:meth:`Sender.stop`).
* a connect that times out (a host cut off: the connect's own short
  deadline, :data:`raylog.config.CONNECT_TIMEOUT_MS`) or is refused, or an
  endpoint missing for a moment, looks the endpoint up again in ZooKeeper
  and connects again until the delivery deadline, spending no try of the
  policy: a failover is ridden through without a resend loop of the caller.

Idempotence (on by default, off with acks=0; wire layout in
:mod:`raylog.transfer.protocol`): the producer picks a random producer id
and numbers the sets it sends to each topic-partition 0, 1, 2, ...; a resent
set keeps its number, so the partition stores it once and answers with the
offset it was stored at. At most 16 sets per partition are unacknowledged,
fewer than the 32 sequences a partition remembers per producer. A set that
fails for good leaves a gap the partition would refuse every later set for
(OutOfOrderSequenceError): the partition then moves to a fresh producer id
and the sets after the gap are numbered again from 0, so that only the
failed set is lost.

With acks=0 nothing comes back: a set is resolved with offset -1 once
written, and a refused set shows up as a failed later write.

The direct round (acks 1 and "all", ``batch_size`` 1; the rules are in
:mod:`raylog.producer.accumulator`): :meth:`Sender.start_direct` writes the
set of a message whose partition was idle on the caller's thread, on the
partition's connection (only one already set up: a connect, and any
retry, stays on the workers), under the partition's next sequence number;
the first thread that waits for its future without a timeout reads the
reply (:meth:`Sender._reap`). A clean reply (a base offset) resolves the
future there and then; anything else (an error reply, a failed write or
read, a wait with a timeout, no wait within the grace) hands the round to
a worker, which settles it exactly as a round of its own (same retries,
same sequence number, so a resent set is still stored once) and then
drains what queued behind it, in order.

Thread-safety: the dispatcher and the workers reach the accumulator's
queues only through its interface (``wait_ready``, ``drain``,
``in_flight_batches``, ``wake_sender``; ``closed`` read), which takes its
lock; a connection and the sequence state of a partition
are used only by the one worker draining that partition.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from raylog.errors import (
    BrokerUnavailableError,
    ClosedError,
    DuplicateSequenceError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    RaylogError,
    TooManyConnectionsError,
)
from raylog.producer.futures import UNKNOWN_OFFSET, scoped_error, track
from raylog.producer.visibility import Visibility
from raylog.retry import RetryPolicy
from raylog.producer.batch import BATCH_OVERHEAD
from raylog.storage import record_batch
from raylog.storage.record_batch import LOG_OVERHEAD, encode_batch, with_producer
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES, MAX_IN_FLIGHT_PER_PARTITION

log = logging.getLogger(__name__)

#: unacknowledged sets per topic-partition (below the 32 a partition remembers)
MAX_IN_FLIGHT_SETS = MAX_IN_FLIGHT_PER_PARTITION
#: sets per round with acks=0 (nothing to wait for: a bound on the memory a
#: round holds, its encoded sets, and on the objects it keeps alive)
MAX_UNACKED_ROUND_SETS = 256
#: partitions drained at once (worker threads)
MAX_IN_FLIGHT_PARTITIONS = 8
_MAX_PRODUCER_ID = (1 << 63) - 1
_MAX_SEQUENCE = (1 << 31) - 1
#: the producerEpoch of raylog's idempotent batches (a fresh id, never a new epoch)
PRODUCER_EPOCH = 0
#: a record batch's attributes bit 4: the batch belongs to a transaction (raylog.storage.record_batch)
TRANSACTIONAL = 0x10


def new_producer_id() -> int:
    """A random non-negative i63 (no coordination, WIRE)."""
    return random.SystemRandom().randint(0, _MAX_PRODUCER_ID)


class PartitionSequences:
    """Idempotence state of one topic-partition (drain-worker confined):
    the producer id and epoch its batches carry, their attributes (a
    transaction's: the transactional bit) and the next sequence."""

    __slots__ = ("producer_id", "next", "epoch", "attributes")

    def __init__(self, producer_id: int, epoch: int = PRODUCER_EPOCH, attributes: int = 0):
        self.producer_id = producer_id
        self.next = 0
        self.epoch = epoch
        self.attributes = attributes

    def take(self, count: int = 1) -> int:
        """The base sequence of a batch of ``count`` records (its records
        are numbered base .. base + count - 1, as Kafka's; wrapping at the
        i32's end)."""
        seq = self.next
        self.next = (seq + count) & _MAX_SEQUENCE
        return seq

    def restart(self) -> None:
        """A fresh producer id after a gap: later sets are numbered from 0.
        Not for a transaction's sets: the coordinator's id is the only one
        they may carry (the failed set makes the transaction abortable, and
        the abort's new epoch numbers the next transaction's sets from 0)."""
        if self.attributes & TRANSACTIONAL:
            return
        self.producer_id = new_producer_id()
        self.next = 0


class _Direct:
    """The sender's state of a direct round (a claim's ``work``)."""

    __slots__ = ("set", "state", "conn", "correlation", "error", "result", "finished")

    def __init__(self):
        self.set = None  # the _Set written; None: nothing was written
        self.state = None  # the partition's PartitionSequences (idempotent)
        self.conn = None
        self.correlation = 0
        self.error = None  # the write or the read failed with it
        self.result = _UNREAD  # the reply, once read
        self.finished = False  # resolved: nothing left to do


_UNREAD = object()


class _Set:
    """One batch on its way: its record batch (format 2) and base sequence."""

    __slots__ = ("batch", "payload", "sequence")

    def __init__(self, batch, payload: bytes, sequence: int = -1):
        self.batch = batch
        self.payload = payload
        self.sequence = sequence

    def renumber(self, state: PartitionSequences) -> None:
        """Under ``state``'s (fresh) producer id, with its next sequences."""
        self.sequence = state.take(len(self.batch.values))
        self.payload = with_producer(self.payload, state.producer_id, state.epoch, self.sequence)


def encode(batch, compression: str | None, state: PartitionSequences | None) -> bytes:
    """The record batch (format 2, docs/design.md §2) of a producer batch,
    carrying the producer id and the next base sequence of ``state`` when
    idempotent (taken only once the batch is known to fit: :meth:`PartitionSequences.take`)."""
    headers = batch.headers
    fast = record_batch._speedups
    if fast is not None and compression is None and headers is None and batch.timestamps is None:
        # the common case straight to the compiled encoder (encode_batch's checks are for arbitrary callers)
        if state is None:
            payload = fast.batch_encode(batch.values, batch.keys, int(batch.created * 1000), 0, -1, -1, -1)
        else:
            payload = fast.batch_encode(batch.values, batch.keys, int(batch.created * 1000), state.attributes,
                                        state.producer_id, state.epoch, state.next)
        if payload is not None:
            return payload
    timestamps = batch.timestamps if batch.timestamps is not None else int(batch.created * 1000)
    if headers is not None:
        headers = [headers.get(i) for i in range(len(batch.values))]
    if state is None:
        return encode_batch(batch.values, batch.keys, headers, timestamps, compression)
    return encode_batch(
        batch.values, batch.keys, headers, timestamps, compression,
        producer_id=state.producer_id, producer_epoch=state.epoch, base_sequence=state.next,
        transactional=bool(state.attributes & TRANSACTIONAL),
    )


def too_large(batch, payload: bytes) -> MessageTooLargeError | None:
    """The error of a batch whose record batch is over the topic's
    ``max_message_bytes`` (batchLength: the bytes after its first 12)."""
    length = len(payload) - LOG_OVERHEAD
    limit = batch.limit + BATCH_OVERHEAD
    if length <= limit:
        return None
    return MessageTooLargeError(
        f"a record batch of {length} bytes ({len(batch.values)} message(s)) is larger than the "
        f"topic's max_message_bytes ({limit}); send smaller messages or raise max_message_bytes",
        size=length,
        limit=limit,
    )


class Sender:
    """The dispatcher thread and the drain workers (see the module docstring)."""

    def __init__(
        self,
        accumulator,
        metadata,
        *,
        acks: int,
        idempotent: bool,
        compression: str | None,
        retry: RetryPolicy,
        request_timeout_s: float,
        on_resolved,
        on_failed=None,
        periodic=None,
        max_in_flight_sets: int = MAX_IN_FLIGHT_SETS,
        max_in_flight_partitions: int = MAX_IN_FLIGHT_PARTITIONS,
        transaction=None,
    ):
        self._acc = accumulator
        #: a transactional producer's :class:`~raylog.producer.transaction.TransactionManager`
        self.transaction = transaction
        self._metadata = metadata
        self.acks = acks
        self.idempotent = idempotent
        self.compression = compression
        self.retry = retry
        self.request_timeout_s = request_timeout_s
        self._on_resolved = on_resolved  # (batches of a round, all resolved), lock not held
        # (batch, its scoped error) before its future fails: whoever the failed future wakes finds the
        # failure already counted (a close() right after it raises it again)
        self._on_failed = on_failed
        self._periodic = periodic  # () -> seconds until it is due again (audit); lock not held
        self.max_in_flight_sets = max_in_flight_sets
        self.producer_id = new_producer_id() if idempotent else -1
        #: acks=1: the acknowledged offsets that flush() waits to be readable
        #: (raylog.producer.visibility); acks="all" replies once readable
        self.visibility = Visibility(metadata, request_timeout_s) if acks == 1 else None
        self._connections: dict[tuple[str, int], object] = {}
        self._abandon = threading.Event()  # set by close(): stop retrying
        self._sequences: dict[tuple[str, int], PartitionSequences] = {}
        self._pool = ThreadPoolExecutor(max_in_flight_partitions, thread_name_prefix="raylog-sender")
        self._thread = threading.Thread(target=self._run, name="raylog-producer", daemon=True)
        self._thread.start()

    # -- dispatcher --------------------------------------------------------------

    def _run(self) -> None:
        acc = self._acc
        periodic_at = time.monotonic()
        while True:
            due = acc.wait_ready(periodic_at if self._periodic is not None else None)
            if due is None:
                return
            for tp in due:
                self._pool.submit(self._drain, tp)
            if self._periodic is not None and time.monotonic() >= periodic_at and not acc.closed:
                try:
                    periodic_at = time.monotonic() + self._periodic()
                except Exception:  # noqa: BLE001 - a periodic task never stops the sender
                    log.exception("producer periodic task failed")
                    periodic_at = time.monotonic() + 1.0

    # -- the direct round (the caller's thread) ------------------------------------

    def start_direct(self, claim) -> None:
        """Write the set of a claimed batch on the caller's thread (the
        claim's lock is held on entry and released here); the reply is left
        for :meth:`_reap`. Whatever does not fit the direct round (no
        connection set up yet, a set over the limit, a failed write) is
        handed to a worker."""
        batch = claim.batch
        tp = (batch.topic, batch.partition)
        work = _Direct()
        claim.attach(work)
        written = False
        try:
            conn = self._connections.get(tp)
            if conn is None or not conn.connected or self._abandon.is_set():
                return
            state = self._state(tp)
            payload = encode(batch, self.compression, state)
            if too_large(batch, payload) is not None:
                return  # the worker refuses it (no sequence number spent)
            one = _Set(batch, payload, state.take(len(batch.values)) if state is not None else -1)
            work.set, work.state, work.conn = one, state, conn
            try:
                work.correlation = conn.write_set(tp[0], tp[1], payload, self.acks)
            except RaylogError as err:
                work.error = err
                return
            written = True
            batch.future.read_reply_with(partial(self._reap, claim))  # reap(read, timeout_s=None)
        finally:
            claim.let_go()
            if not written:
                self._acc.hand_over(tp, claim)

    def _reap(self, claim, read: bool, timeout_s: float | None = None) -> None:
        """A thread waits for a direct round's future: with ``read``, read
        the reply here (if it starts to arrive within ``timeout_s``) and
        resolve it if it is a base offset; else (or when a worker holds the
        round) leave the round to a worker."""
        batch = claim.batch
        tp = (batch.topic, batch.partition)
        if not read:
            self._acc.hand_over(tp, claim)
            return
        if not claim.hold(blocking=False):
            return  # a worker is finishing it
        finished = False
        try:
            work = claim.round
            if work.finished or work.set is None or work.error is not None or work.result is not _UNREAD:
                return
            if timeout_s is not None and not work.conn.reply_waiting(timeout_s):
                return  # not within the caller's timeout: a worker waits on
            claim.set_reading(True)
            try:
                result = work.conn.read_set_reply(work.correlation)
            except RaylogError as err:
                work.error = err
                return
            finally:
                claim.set_reading(False)
            work.result = result
            if isinstance(result, RaylogError):
                return  # settled by a worker (retries, gaps)
            self._resolve(batch, result)
            work.finished = finished = True
        finally:
            claim.let_go()
            if not finished:
                self._acc.hand_over(tp, claim)
        self._on_resolved([batch])
        self._acc.release_direct(tp, claim)

    def _finish_direct(self, tp: tuple[str, int], claim) -> None:
        """On the worker that took the partition over: settle its direct
        round as a round of its own (the claim's lock held)."""
        work = claim.round
        if work is None or work.set is None:  # nothing was written: an ordinary round
            self._send(tp, [claim.batch])
            return
        pending = [work.set]
        state = work.state
        try:
            error = work.error
            if error is None:
                try:
                    result = work.result
                    if result is _UNREAD:
                        result = work.result = work.conn.read_set_reply(work.correlation)
                    self._settle(tp, [work.set], [result], pending, state)
                except RaylogError as err:
                    error = err
            if error is not None:
                if not error.retriable:
                    raise error
                self._on_retry(tp, error)  # a new connection (or ClosedError once closed)
            if pending:
                self._send_within_deadline(tp, pending, state)
        except RaylogError as err:
            self._give_up(pending, state, err)

    # -- a drain worker -----------------------------------------------------------

    def _drain(self, tp: tuple[str, int]) -> None:
        acc = self._acc
        limit = MAX_UNACKED_ROUND_SETS if not self.acks else self.max_in_flight_sets
        claim = acc.take_direct(tp)
        if claim is not None:
            with claim:
                work = claim.round
                if work is None or not work.finished:
                    try:
                        self._finish_direct(tp, claim)
                    except BaseException as err:  # noqa: BLE001 - never leave a future hanging
                        log.exception("producer sender failed on %s-%d", *tp)
                        if not claim.batch.future.done():
                            self._resolve(claim.batch, error=err)
                    if work is not None:
                        work.finished = True
                    self._on_resolved([claim.batch])
        while True:
            batches = acc.drain(tp, limit)
            if not batches:
                return
            try:
                self._send(tp, batches)
            except BaseException as err:  # noqa: BLE001 - never leave a future hanging
                log.exception("producer sender failed on %s-%d", *tp)
                for batch in batches:
                    if not batch.future.done():
                        self._resolve(batch, error=err)
            self._on_resolved(batches)

    def _resolve(self, batch, base: int | None = None, error: BaseException | None = None) -> None:
        if error is None:
            if self.visibility is not None:
                self.visibility.note(batch.topic, batch.partition, base)
            batch.future.resolve(base)
        else:
            track(batch)  # (the error's traceback may hold it: a cycle the collector must see)
            error = scoped_error(error, batch.topic, batch.partition)
            if self._on_failed is not None:
                self._on_failed(batch, error)
            batch.future.fail(error)

    def _send(self, tp: tuple[str, int], batches: list) -> None:
        topic, partition = tp
        if self._abandon.is_set():
            for b in batches:
                self._resolve(b, error=ClosedError("the producer was closed before this message was sent"))
            return
        sets = []
        try:
            state = self._state(tp)
        except RaylogError as err:  # a transaction's partition the coordinator did not add
            for b in batches:
                self._resolve(b, error=err)
            return
        for b in batches:
            payload = encode(b, self.compression, state)
            error = too_large(b, payload)
            if error is not None:
                # Refused here rather than by the partition: no sequence number is spent on it.
                self._resolve(b, error=error)
                continue
            sets.append(_Set(b, payload, state.take(len(b.values)) if state is not None else -1))
        if not sets:
            return
        pending = sets
        try:
            self._send_within_deadline(tp, pending, state)
        except RaylogError as err:
            self._give_up(pending, state, err)

    def _state(self, tp: tuple[str, int]) -> PartitionSequences | None:
        """The idempotence state of ``tp`` (None when not idempotent). In a
        transaction: the partition added to it first (raises the
        coordinator's refusal), under the transaction's id and epoch."""
        if not self.idempotent:
            return None
        if self.transaction is not None:
            producer_id, epoch = self.transaction.add_partition(tp)
            state = self._sequences.get(tp)
            if state is None or state.producer_id != producer_id or state.epoch != epoch:
                # a new epoch (every transaction's): its sequences start at 0
                state = self._sequences[tp] = PartitionSequences(producer_id, epoch, TRANSACTIONAL)
            return state
        state = self._sequences.get(tp)
        if state is None:
            state = self._sequences[tp] = PartitionSequences(self.producer_id)
        return state

    def _give_up(self, pending: list, state: PartitionSequences | None, err: RaylogError) -> None:
        """Fail ``pending`` with ``err``: these sets may or may not be
        stored. Later sets must not wait on them, so the partition gets a
        fresh producer id."""
        if state is not None:
            state.restart()
        for s in pending:
            self._resolve(s.batch, error=err)
        pending.clear()

    def _send_within_deadline(self, tp, pending: list, state: PartitionSequences | None) -> None:
        """``_attempt`` under the retry policy; an endpoint that refuses the
        connection as full (TooManyConnectionsError: it frees slots as
        connections end) is tried again until the delivery deadline, not
        only for the policy's tries."""
        while True:
            policy = self._retry_for(pending)
            try:
                policy.call(self._attempt, tp, pending, state, on_retry=lambda err: self._on_retry(tp, err))
                return
            except TooManyConnectionsError as err:
                if policy.deadline_s is None or self._abandon.is_set():
                    raise
                pause = min(policy.max_delay_s, policy.deadline_s)
                if pause <= 0 or policy.deadline_s - pause <= 0:
                    raise
                self._on_retry(tp, err)
                time.sleep(pause)

    def _attempt(self, tp, pending: list, state: PartitionSequences | None) -> None:
        """Send ``pending`` (removing each set that gets its outcome); raise a
        retriable error if some must be sent again."""
        topic, partition = tp
        while pending:
            # The first set under a producer id goes alone: a partition takes
            # any sequence from an id it does not know, so a later set must
            # not arrive first if this one is refused.
            sending = pending[:1] if state is not None and pending[0].sequence == 0 else pending
            if self._abandon.is_set():  # stopped at exit: no new connection to a peer that may not answer
                raise ClosedError(f"the producer was stopped while {topic}-{partition} was being sent; "
                                  f"these messages may or may not be stored")
            conn = self._connected(tp, pending)
            try:
                # The producer's id and sequences travel in the batches
                # (format 2): the partition judges them from there.
                results = conn.produce_sets(topic, partition, [s.payload for s in sending], self.acks)
            except RaylogError as err:
                if self.acks or err.retriable:
                    raise
                # acks=0: the partition refused an earlier set (already
                # resolved with offset -1, as acks=0 promises no more) and
                # closed the connection before these were written: send
                # them again on a new one.
                log.warning("%s-%d: an earlier acks=0 set was refused: %s", topic, partition, err)
                self._reset(tp)
                continue
            if results is None:  # acks=0: written is all we learn
                for s in sending:
                    self._resolve(s.batch, UNKNOWN_OFFSET)
                del pending[: len(sending)]
                continue
            self._settle(tp, sending, results, pending, state)

    def _settle(self, tp, sending: list, results: list, pending: list, state: PartitionSequences | None) -> None:
        """Resolve the sets of ``sending`` (the first sets of ``pending``) by
        their ``results`` and leave in ``pending`` those to send again;
        raise a retriable error if there are any."""
        topic, partition = tp
        again = []
        retry_error = None
        gap = False
        for s, result in zip(sending, results):
            if not isinstance(result, RaylogError):
                self._resolve(s.batch, result)
            elif isinstance(result, DuplicateSequenceError):
                log.warning(
                    "%s-%d: a resent set was stored before but its offset is no longer known: %s",
                    topic, partition, result,
                )
                self._resolve(s.batch, UNKNOWN_OFFSET)
            elif isinstance(result, OutOfOrderSequenceError) and (gap or retry_error is not None or again):
                again.append(s)  # refused only because an earlier set of this round was
            elif result.retriable:
                again.append(s)
                retry_error = retry_error or result
            else:
                self._resolve(s.batch, error=result)  # this set fails alone
                gap = True
        pending[:] = again + pending[len(sending) :]
        if gap and state is not None:
            # The partition refuses everything after the failed set under
            # this producer id (in this round or a later one): continue
            # under a fresh one.
            state.restart()
            for s in pending:
                s.renumber(state)
        if retry_error is not None:
            raise retry_error
        if again and not gap:
            raise OutOfOrderSequenceError(
                f"{topic}-{partition}: the partition refused {len(again)} set(s) as out of order; resending"
            )

    # -- connections ---------------------------------------------------------------

    def _connection(self, tp: tuple[str, int]):
        conn = self._connections.get(tp)
        if conn is None:
            topic, partition = tp
            host, port = self._metadata.endpoint(topic, partition, wait_s=1.0)
            conn = BrokerConnection(
                host,
                port,
                token=self._metadata.settings.token,
                timeout_s=self.request_timeout_s,
                max_frame_bytes=self._metadata.config(topic).max_message_bytes + FRAME_OVERHEAD_BYTES,
            )
            self._connections[tp] = conn
        return conn

    def _connected(self, tp: tuple[str, int], pending: list):
        """The partition's connection, set up. A connect that times out or
        is refused (a host cut off, a leader gone), or an endpoint missing
        for a moment (a failover), looks the endpoint up again in ZooKeeper
        and tries again with a short back-off until the delivery deadline of
        the oldest pending set: no try of the retry policy is spent on it,
        so a producer rides through a failover without a resend loop of its
        own. Any other error (a refused token) is raised at once."""
        backoff = None
        while True:
            try:
                conn = self._connection(tp)
                conn.connect()
                return conn
            except BrokerUnavailableError:
                self._reset(tp)
                if backoff is None:
                    backoff = self._connect_policy(pending).start()
                if self._abandon.is_set() or not backoff.wait():
                    raise

    def _connect_policy(self, sets: list) -> RetryPolicy:
        """Back-off for :meth:`_connected`, bounded by the delivery deadline."""
        deadline_s = self.retry.deadline_s if self.retry.deadline_s is not None else self.request_timeout_s
        oldest = min(s.batch.created for s in sets)
        return RetryPolicy.until(max(0.0, oldest + deadline_s - time.time()), delay_s=0.05, max_delay_s=0.5)

    def _retry_for(self, sets: list) -> RetryPolicy:
        """The producer's policy with its deadline counted from the oldest
        batch's creation (at least one try is always made)."""
        policy = self.retry
        if policy.deadline_s is None or not sets:
            return policy
        oldest = min(s.batch.created for s in sets)
        left = max(0.0, oldest + policy.deadline_s - time.time())
        return dataclasses.replace(policy, deadline_s=left)

    def _on_retry(self, tp: tuple[str, int], err: BaseException) -> None:
        if self._abandon.is_set():
            raise ClosedError(
                f"the producer was closed while {tp[0]}-{tp[1]} was being retried ({err}); "
                f"these messages may or may not be stored"
            ) from err
        self._reset(tp)

    def _reset(self, tp: tuple[str, int]) -> None:
        """Before a retry: a new connection to a freshly looked-up endpoint
        (the actor may have moved or restarted)."""
        conn = self._connections.pop(tp, None)
        if conn is not None:
            conn.close()
        self._metadata.forget(*tp)

    # -- life cycle ------------------------------------------------------------------

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop once everything sealed is resolved (the accumulator must be
        marked closed first)."""
        self._acc.wake_sender()
        self._thread.join(timeout=timeout_s)
        self._abandon.set()  # what is still retried fails now (queued sets get one try)
        self._pool.shutdown(wait=True, cancel_futures=False)
        for conn in list(self._connections.values()):
            conn.close()
        self._connections.clear()
        if self.visibility is not None:
            self.visibility.close()

    def stop(self, timeout_s: float) -> None:
        """Stop now (the producer's close at interpreter exit, once its
        delivery deadline has passed; the accumulator must be marked closed
        first): what is still being sent or retried is abandoned (its
        futures fail with ClosedError), the connections are closed, which
        ends a request blocked on one, and the threads are joined for up
        to ``timeout_s`` in all."""
        end = time.monotonic() + timeout_s
        self._abandon.set()
        for conn in list(self._connections.values()):
            conn.close()  # may be called from another thread: a blocked call ends
        self._acc.wake_sender()
        self._thread.join(timeout=max(0.0, end - time.monotonic()))
        self._pool.shutdown(wait=False, cancel_futures=False)
        for worker in list(getattr(self._pool, "_threads", ())):
            worker.join(timeout=max(0.0, end - time.monotonic()))
        for conn in list(self._connections.values()):
            conn.close()
        self._connections.clear()
