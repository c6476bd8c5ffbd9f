"""The producer: ``send`` returns a future; batches go out in the background.

    producer = client.producer(acks="all")
    future = producer.send("clicks", b"value", key=b"user-42")
    partition, offset = future.result()        # or raises, naming clicks-<p>
    producer.flush()                           # raises DeliveryError listing what failed

``send`` appends the message to the open batch of its partition (a keyed
message goes to ``crc32c(key) mod partitions``, or by the key hash named by
``partitioner=`` (``"murmur2"``: as Kafka's Java client; ``"crc32"``: as
librdkafka; :mod:`raylog.producer.partitioner`), a keyless one sticks to one
partition per batch) and returns a :class:`~raylog.producer.futures.SendFuture`.
The :mod:`accumulator <raylog.producer.accumulator>` seals a batch when it
holds ``batch_size`` messages, would outgrow the topic's
``max_message_bytes``, or is ``linger_ms`` old; the
:mod:`sender <raylog.producer.sender>` sends each partition's sealed batches
on that partition's connection, partitions in parallel, and resolves the
futures.

acks:

* ``0`` (the paper's default) writes and does not wait: at-most-once;
  futures report offset -1 and a refused set shows up as a failed later
  write. Not idempotent.
* ``1`` waits until the partition's log has the set (it survives a
  process kill once flushed); ``flush()`` also waits until every set sent
  can be read (:mod:`raylog.producer.visibility`).
* ``"all"`` waits until the set is flushed (fsynced) and visible to
  consumers: after ``flush()`` every message sent can be read
  (read-your-writes).

Idempotence (``enable_idempotence=True``, the default with acks 1 and
"all"): the producer numbers its sets per partition, so that a set resent
after a lost connection or a restarted partition actor is stored once.

Failures keep their scope: a set refused by its partition, or still failing
when the :class:`~raylog.retry.RetryPolicy` gives up (bounded tries and a
deadline), fails alone. Its futures raise the typed error (its message
starts with ``<topic>-<partition>``); ``flush`` and ``close`` raise one
:class:`~raylog.errors.DeliveryError` listing every topic-partition that
lost messages since the last flush and how many; every other message is
delivered.

Every message of a batch carries the batch's creation time as its
timestamp unless ``send`` is given one.

Transactions (``transactional_id=``; :mod:`raylog.producer.transaction`):
``begin_transaction``, then sends (flagged transactional, under the
coordinator's producer id and epoch; no direct round, no compiled keyless
path: every send checks the transaction first), then
``send_offsets_to_transaction`` and ``commit_transaction`` (deliver all,
then end) or ``abort_transaction``.

At interpreter exit a producer still open is closed for the caller
(:func:`close_open_producers`, run by a hook that comes before the
interpreter stops its thread pools, so the sender can still work): what
was sent is delivered, waiting at most the delivery deadline
(``retry.deadline_s``); what is still not delivered then is abandoned and
named in one warning line (its count per topic-partition). The sender's
threads are stopped before the hook returns.

Thread-safety: ``send``, ``send_batch``, ``flush`` and ``close`` may be
called from any number of threads; the accumulator's lock guards the
batches, and a partition's socket is used by one thread at a time: a
sender's worker, or, in the direct round, the caller's thread.

The direct round (``batch_size=1`` with acks 1 or "all": one acknowledged
message at a time, as a request handler sends): a keyless ``send`` whose
partition has nothing queued or in flight writes its set on the caller's
thread and returns its future at once; ``result()`` (or ``flush``) then
reads the reply on the caller's thread. No hand-off to the sender's
threads on the way out or back; ordering, idempotence (the set carries
the partition's next sequence number, and any retry goes to a worker
with it) and the futures are as on the workers' path. The rules are in
:mod:`raylog.producer.accumulator`.

Compiled path: when ``raylog.producer._fastsend`` is built, a producer's
``send`` is its :class:`KeylessSend`, which takes the commonest call (a
keyless message that joins its topic's open batch without sealing it; with
``batch_size`` 1, one to a one-partition topic while the sender is
draining it) without Python code and hands every other call to ``Producer.send``
below, the reference. It appends only while the accumulator's lock is
free, and without letting go of the GIL, so that to every other thread
the append is as one made under the lock (``_fastsend.c`` says why).
Its :class:`GroupFill` places the groups of a keyed ``send_batch`` call in
their partitions' open batches, under the lock (``RecordAccumulator._append_groups``
is the reference), and the compiled grouping checks the call's types.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import types
import weakref
from typing import Iterable, Sequence

from raylog.errors import (
    ArgumentTypeError,
    ClosedError,
    ConfigError,
    DeliveryError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    RequestTimeoutError,
    UnknownPartitionError,
)
from raylog.producer.accumulator import DEFAULT_MAX_BLOCK_S, RecordAccumulator
from raylog.producer.batch import ProducerBatch
from raylog.producer.futures import BatchFuture, CallFuture, SendFuture
from raylog.producer.partitioner import DEFAULT_PARTITIONER, key_partitioner
from raylog.producer.sender import MAX_IN_FLIGHT_PARTITIONS, Sender
from raylog.producer.transaction import DEFAULT_TRANSACTION_TIMEOUT_MS, TransactionManager, find_coordinator
from raylog.transfer.protocol import ACKS_ALL
from raylog.retry import RetryPolicy
from raylog.audit import AUDIT_TOPIC, DEFAULT_INTERVAL_MS, DEFAULT_WINDOW_MS, AuditCounter, new_source_id
from raylog.storage.message import codec_id

try:  # the compiled keyless case of send (optional; Producer.send is the reference)
    from raylog.producer import _fastsend
except ImportError:  # pragma: no cover - built without a compiler
    _fastsend = None

log = logging.getLogger(__name__)

_ACKS = {0: 0, 1: 1, "all": ACKS_ALL, ACKS_ALL: ACKS_ALL}
_BYTES = {bytes}
_KEY_TYPES = {bytes, type(None)}
#: messages per slice of ``send_many``
SEND_MANY_SLICE = 10_000
#: the delivery deadline at exit of a producer whose retry policy has none
EXIT_DELIVERY_DEFAULT_S = 30.0
#: after the delivery deadline at exit: time for the sender's threads to stop
EXIT_STOP_GRACE_S = 5.0

#: every producer of this process not closed yet (closed at exit)
_OPEN_PRODUCERS: "weakref.WeakSet[Producer]" = weakref.WeakSet()


def check_types(values: Sequence, keys: Sequence | None) -> None:
    """TypeError unless every value is bytes and every key bytes or None."""
    kinds = set(map(type, values))  # one C-level pass, not a check per message
    if kinds - _BYTES:
        raise ArgumentTypeError(
            f"values must be bytes, got {', '.join(sorted(k.__name__ for k in kinds - _BYTES))}; "
            f"encode them, e.g. value.encode()"
        )
    if keys is not None:
        kinds = set(map(type, keys))
        if kinds - _KEY_TYPES:
            raise ArgumentTypeError(
                f"keys must be bytes or None, got {', '.join(sorted(k.__name__ for k in kinds - _KEY_TYPES))}; "
                f"encode them, e.g. key.encode()"
            )


def check_key(key) -> None:
    """ArgumentTypeError unless ``key`` is bytes or None (a str key would
    otherwise fail deep in the partitioner, without naming the key)."""
    if key is not None and type(key) is not bytes:
        raise ArgumentTypeError(f"key must be bytes, got {type(key).__name__}; encode it, e.g. key.encode()")


def check_headers(headers) -> list[tuple[str, bytes | None]]:
    """``headers`` as a list of ``(str, bytes | None)`` pairs, or
    ArgumentTypeError naming the first that is not one."""
    out = []
    for i, pair in enumerate(headers):
        if type(pair) not in (tuple, list) or len(pair) != 2:
            raise ArgumentTypeError(
                f"headers[{i}] must be a (str, bytes) pair, got {pair!r}; e.g. headers=[('trace', b'abc')]"
            )
        name, value = pair
        if type(name) is not str:
            raise ArgumentTypeError(f"headers[{i}]'s key must be a str, got {type(name).__name__}")
        if value is not None and type(value) is not bytes:
            raise ArgumentTypeError(
                f"headers[{i}]'s value must be bytes or None, got {type(value).__name__}; encode it, e.g. v.encode()"
            )
        out.append((name, value))
    return out


class Producer:
    def __init__(
        self,
        metadata,
        *,
        batch_size: int = 50,
        linger_ms: float = 5,
        compression: str | None = None,
        acks: int | str = 1,
        enable_idempotence: bool = True,
        retry: RetryPolicy | None = None,
        max_buffered_messages: int = 500_000,
        max_block_s: float = DEFAULT_MAX_BLOCK_S,
        request_timeout_s: float = 30.0,
        max_in_flight_partitions: int = MAX_IN_FLIGHT_PARTITIONS,
        audit: bool = False,
        audit_window_ms: int | None = None,
        audit_interval_ms: int | None = None,
        partitioner: str = DEFAULT_PARTITIONER,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        transaction_coordinator=None,
    ):
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if isinstance(acks, bool) or acks not in _ACKS:
            raise ConfigError(
                f"acks must be 0 (no reply), 1 (wait for the log) or 'all' (wait until flushed and "
                f"visible), got {acks!r}"
            )
        if linger_ms < 0:
            raise ConfigError(f"linger_ms must be non-negative, got {linger_ms}")
        if max_buffered_messages < 1 or max_in_flight_partitions < 1:
            raise ConfigError("max_buffered_messages and max_in_flight_partitions must be at least 1")
        codec_id(compression)  # raises ConfigError for an unknown codec
        if transactional_id is not None and (_ACKS[acks] != ACKS_ALL or not enable_idempotence):
            raise ConfigError(
                f"a transactional producer needs acks='all' and enable_idempotence=True (as Kafka's), got "
                f"acks={acks!r}, enable_idempotence={enable_idempotence!r}")
        key_partition = key_partitioner(partitioner)  # raises ConfigError for an unknown one
        self._metadata = metadata
        self.partitioner = partitioner
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.compression = compression
        self.acks = "all" if _ACKS[acks] == ACKS_ALL else acks
        self.idempotent = bool(enable_idempotence) and _ACKS[acks] != 0
        self.retry = retry or RetryPolicy(max_tries=8, delay_s=0.05, max_delay_s=1.0, deadline_s=30.0)
        self.request_timeout_s = request_timeout_s

        self._stats_lock = threading.Lock()
        self.sent_messages = 0
        self.sent_batches = 0
        self.failed_messages = 0
        #: (topic, partition) -> [messages lost, first error] since the last flush
        self._failures: dict[tuple[str, int], list] = {}
        self._closed = False

        self.client_id = new_source_id("producer")
        self._audit = AuditCounter(audit_window_ms or DEFAULT_WINDOW_MS) if audit else None
        self._audit_interval_s = (audit_interval_ms or DEFAULT_INTERVAL_MS) / 1000.0

        #: a transactional producer's state (raylog.producer.transaction); None otherwise
        self.transaction = None
        if transactional_id is not None:
            if transaction_coordinator is None:
                transaction_coordinator = find_coordinator(metadata.settings.cluster)
            self.transaction = TransactionManager(transaction_coordinator, transactional_id,
                                                  transaction_timeout_ms)
            self.transaction.init()  # fences an older producer of the id
        self._acc = RecordAccumulator(
            metadata,
            batch_size=batch_size,
            linger_ms=linger_ms,
            compression=compression,
            max_buffered_messages=max_buffered_messages,
            max_block_s=max_block_s,
            key_partition=key_partition,
        )
        if self._audit is not None:
            self._acc.on_seal = self._count_for_audit
        # a topic that gains partitions (client.add_partitions) is partitioned over
        # its new count; metadata stand-ins without the callback keep their counts
        self._follow_partitions = getattr(metadata, "on_partitions", None) and self._acc.partitions_changed
        if self._follow_partitions:
            metadata.on_partitions(self._follow_partitions)
        self._sender = Sender(
            self._acc,
            metadata,
            acks=_ACKS[acks],
            idempotent=self.idempotent,
            compression=compression,
            retry=self.retry,
            request_timeout_s=request_timeout_s,
            on_resolved=self._resolved,
            on_failed=self._failed,
            periodic=self._publish_audit if self._audit is not None else None,
            max_in_flight_partitions=max_in_flight_partitions,
            transaction=self.transaction,
        )
        #: the random id of the idempotent sets (-1 when not idempotent)
        self.producer_id = self._sender.producer_id
        #: the direct round (see raylog.producer.accumulator): batch 1 with acks
        self._direct = batch_size == 1 and _ACKS[acks] != 0 and self.transaction is None
        _OPEN_PRODUCERS.add(self)
        if _fastsend is not None and self.transaction is None:
            # send's commonest case compiled (a keyless message); every other
            # call goes to Producer.send.
            self.send = _fastsend.KeylessSend(
                self._acc.compiled_send_view(),
                types.MethodType(Producer.send, self),
                SendFuture,
                ProducerBatch,
                BatchFuture,
            )
            # and send_batch's keyed groups into their open batches
            self._acc.fill_groups = _fastsend.GroupFill(ProducerBatch)

    # -- the caller's side ---------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> SendFuture:
        """Queue one message; returns its future at once (unless the buffer
        is full: then it waits up to ``max_block_s`` for room).

        ``value`` ``None`` is a tombstone (a null value, kept distinct from
        ``b""``); ``headers`` are ``(str, bytes | None)`` pairs, kept in
        order, duplicates allowed (docs/design.md §2). A transactional
        producer sends only inside a transaction."""
        if self.transaction is not None:
            self.transaction.check_send()
        if type(value) is not bytes and value is not None:
            raise ArgumentTypeError(
                f"value must be bytes (or None for a tombstone), got {type(value).__name__}; "
                f"encode it first, e.g. value.encode()"
            )
        if headers:
            headers = check_headers(headers)
        if key is None and partition is None and timestamp_ms is None and not headers and value is not None:
            if self._direct:
                # batch 1 with acks: an idle partition's set goes out on this
                # thread, and its reply is read by the thread that waits for it
                future, claim = self._acc.append_direct(topic, value)
                if claim is not None:
                    self._sender.start_direct(claim)
                return future
            return self._acc.append_keyless(topic, value)  # the hot path (batch 1: one set per message)
        check_key(key)
        if partition is not None:
            self._check_partition(topic, partition)
        return self._acc.append(topic, value, key, partition, timestamp_ms, headers or None)

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None = None,
        *,
        partition: int | None = None,
    ) -> CallFuture:
        """Queue many messages at once (each still partitioned by its key);
        returns one future for all of them (see :class:`CallFuture`)."""
        if self.transaction is not None:
            self.transaction.check_send()
        if keys is not None and len(keys) != len(values):
            raise ConfigError(f"{len(values)} values but {len(keys)} keys")
        if keys is not None and partition is None:
            # keyed: the compiled grouping checks every value and key on its
            # way; check_types runs only where it does not (before anything
            # is queued either way)
            return self._acc.append_many(topic, values, keys, None, check_types)
        check_types(values, keys)
        if partition is not None:
            self._check_partition(topic, partition)
        return self._acc.append_many(topic, values, keys, partition)

    def send_many(
        self,
        topic: str,
        values: Iterable[bytes],
        keys: Iterable[bytes | None] | None = None,
        *,
        partition: int | None = None,
    ) -> CallFuture:
        """Queue any number of messages, from a list or any iterable (a
        generator too), as ``send_batch`` would in slices of
        :data:`SEND_MANY_SLICE`: each message is partitioned by its key (or
        all go to ``partition``), and the call blocks like ``send`` while the
        buffer is full, so memory stays bounded however many values come.
        Returns one :class:`CallFuture` for them all (``result()``:
        ``(partition, offset)`` in the order given). ``keys``, when given,
        has one key (or ``None``) per value; a length mismatch raises
        ConfigError after the messages before it are queued."""
        call = CallFuture()
        values_it = iter(values)
        keys_it = None if keys is None else iter(keys)
        while True:
            chunk = list(itertools.islice(values_it, SEND_MANY_SLICE))
            chunk_keys = None if keys_it is None else list(itertools.islice(keys_it, len(chunk) or 1))
            if not chunk:
                if chunk_keys:
                    raise ConfigError(f"{len(call)} values but more keys; pass one key (or None) per value")
                return call
            call._merge(self.send_batch(topic, chunk, chunk_keys, partition=partition))

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued so far and wait for its outcome. Raises one
        :class:`DeliveryError` listing each topic-partition that lost
        messages since the last flush (and how many); all else is delivered.
        RequestTimeoutError if the outcomes take longer than ``timeout_s``.

        With acks=1 or "all" it returns only when everything delivered can
        be read (read-your-writes, docs/design.md section 6): acks="all" is
        answered so; for acks=1 flush waits until each partition written to
        has made its sets readable (:mod:`raylog.producer.visibility`)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._audit is not None and not self._closed:
            self._publish_audit()
        acc = self._acc
        with acc.lock:
            acc.seal_all()
            futures = acc.pending_futures() + [b.future for b in acc.in_flight_batches()]
        for future in futures:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                left = 0.0
            try:
                future.wait(left)
            except RequestTimeoutError:
                raise RequestTimeoutError(
                    f"flush did not finish within {timeout_s} s; {acc.buffered} messages still queued "
                    f"(is the cluster reachable?)"
                ) from None
        if self._sender.visibility is not None:
            # acks=1: read-your-writes (docs/design.md section 6), as acks="all" has from its replies
            self._sender.visibility.wait(deadline)
        self._raise_failures()

    # -- transactions (raylog.producer.transaction) ---------------------------

    def _transactional(self) -> TransactionManager:
        if self.transaction is None:
            raise InvalidTxnStateError("this producer is not transactional; make it with "
                                       "client.producer(transactional_id=...)", state="none")
        return self.transaction

    def begin_transaction(self) -> None:
        """Open a transaction: the sends until its end belong to it."""
        self._transactional().begin()

    def send_offsets_to_transaction(self, offsets, group: str) -> None:
        """Commit ``group``'s offsets ``{(topic, partition): offset}`` with
        the transaction: they become the group's committed offsets when it
        commits, and never when it aborts."""
        self._transactional().add_offsets(offsets, group)

    def commit_transaction(self, timeout_s: float | None = None) -> None:
        """Deliver every message of the transaction, then commit it: its
        messages and offsets become visible to ``read_committed`` readers
        together. A send of it that failed makes the commit raise (one
        :class:`DeliveryError`, or :class:`InvalidTxnStateError`): abort
        it then. A transaction the coordinator aborted past its timeout
        raises :class:`InvalidProducerEpochError`."""
        txn = self._transactional()
        txn.check_send()
        try:
            self.flush(timeout_s)
        except DeliveryError as err:
            txn.failed(err)
            txn.check_not_fenced()
            raise
        self._end(txn, True)

    def abort_transaction(self, timeout_s: float | None = None) -> None:
        """Abort the transaction: its messages stay in the logs, hidden
        from ``read_committed`` readers by the abort markers, and its
        offsets are dropped."""
        txn = self._transactional()
        txn.check_not_fenced()
        try:
            self.flush(timeout_s)  # every batch of it has its outcome before the markers
        except DeliveryError:
            pass  # aborted anyway
        self._end(txn, False)

    def _end(self, txn: TransactionManager, commit: bool) -> None:
        try:
            txn.end(commit)
        except InvalidProducerEpochError as err:
            txn.expired(err)  # the coordinator aborted it (its timeout): nothing is open here any more
            raise

    def close(self, timeout_s: float | None = 60.0) -> None:
        """Flush, then stop the sender. Idempotent. Raises like ``flush``."""
        if self._closed:
            return
        try:
            self.flush(timeout_s)
        finally:
            self._closed = True
            _OPEN_PRODUCERS.discard(self)
            if self._follow_partitions:
                self._metadata.off_partitions(self._follow_partitions)
            with self._acc.lock:
                self._acc.closed = True
                self._acc.space.notify_all()
            self._sender.close()
            # Whatever was still queued (a flush that timed out) fails for good.
            for future in self._acc.pending_futures():
                if not future.done():
                    future.fail(ClosedError("the producer was closed before this message was sent"))

    def close_at_exit(self) -> dict[tuple[str, int], int]:
        """Close at interpreter exit: deliver what was sent, waiting at most
        the delivery deadline (``retry.deadline_s``, counted from now), then
        abandon the rest and stop the sender's threads. Never raises; logs
        one warning line naming what was not delivered and returns it
        (messages per topic-partition, failures since the last flush
        included)."""
        if self._closed:
            return {}
        deadline_s = self.retry.deadline_s if self.retry.deadline_s is not None else EXIT_DELIVERY_DEFAULT_S
        acc = self._acc
        with acc.lock:
            acc.seal_all()
            batches = list(acc.open.values()) + [b for queue in acc.ready.values() for b in queue]
            batches += acc.in_flight_batches()
        sizes = [(b.future, (b.topic, b.partition), len(b.values)) for b in batches]
        end = time.monotonic() + deadline_s
        for future, _, _ in sizes:
            try:
                future.wait(max(0.0, end - time.monotonic()))
            except RequestTimeoutError:
                break
        self._closed = True
        _OPEN_PRODUCERS.discard(self)
        with acc.lock:
            acc.closed = True
            acc.space.notify_all()
        self._sender.stop(EXIT_STOP_GRACE_S)  # abandons what is still being sent
        with self._stats_lock:  # the sender has stopped: every failure it saw is here
            lost = {tp: n for tp, (n, _) in self._failures.items()}
            self._failures = {}
        for future, tp, n in sizes:
            if not future.done():  # never reached the sender
                future.fail(ClosedError("the producer was closed at exit before this message was delivered"))
                lost[tp] = lost.get(tp, 0) + n
        if lost:
            log.warning(
                "raylog: at exit, %d message(s) were not delivered within the producer's delivery deadline "
                "(%g s): %s",
                sum(lost.values()), deadline_s, ", ".join(f"{t}-{p}: {n}" for (t, p), n in sorted(lost.items())),
            )
        return lost

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stats(self) -> dict:
        """Counts of messages delivered and failed for good (a failed
        message never counts as sent), and how many are still buffered."""
        with self._stats_lock:
            return {
                "sent_messages": self.sent_messages,
                "sent_batches": self.sent_batches,
                "failed_messages": self.failed_messages,
                "buffered": self._acc.buffered,
                "failed_partitions": sorted(f"{t}-{p}" for t, p in self._failures),
            }

    # -- internals ---------------------------------------------------------------

    def _check_partition(self, topic: str, partition: int) -> None:
        count = self._acc.partitions(topic)
        if not 0 <= partition < count and partition > 0 and self._follow_partitions:
            # added a moment ago (client.add_partitions), before the watch told the metadata?
            count = self._metadata.refresh(topic).partitions
            self._acc.partitions_changed(topic, count)
        if not 0 <= partition < count:
            raise UnknownPartitionError(
                f"{topic!r} has partitions 0..{count - 1}, not {partition}", topic=topic, partition=partition
            )

    def _failed(self, batch, error) -> None:
        """Sender callback for a batch that failed, before its future fails
        (so a flush or close that the failure wakes raises it again)."""
        n = len(batch.values)
        with self._stats_lock:
            self.failed_messages += n
            if self.transaction is not None:
                self.transaction.failed(error)
            entry = self._failures.setdefault((batch.topic, batch.partition), [0, error])
            entry[0] += n

    def _resolved(self, batches) -> None:
        """Sender callback, once per round of a partition's batches (each
        failed one counted already by :meth:`_failed`)."""
        done = sent = sent_batches = 0
        for batch in batches:
            n = len(batch.values)
            done += n
            if batch.future.error is None:
                sent += n
                sent_batches += 1
        with self._stats_lock:
            self.sent_messages += sent
            self.sent_batches += sent_batches
        acc = self._acc
        with acc.lock:
            acc.buffered -= done
            acc.space.notify_all()

    def _raise_failures(self) -> None:
        with self._stats_lock:
            failures, self._failures = self._failures, {}
        if failures:
            raise DeliveryError.of({tp: (n, err) for tp, (n, err) in failures.items()})

    # -- audit --------------------------------------------------------------------

    def _count_for_audit(self, batch) -> None:
        """Count a sealed batch by its messages' timestamps (lock held)."""
        if batch.timestamps is None:
            self._audit.add(batch.topic, int(batch.created * 1000), len(batch.values))
        else:
            self._audit.add_timestamps(batch.topic, batch.timestamps)

    def _publish_audit(self) -> float:
        """Queue the audit counts since the last time as events for the audit
        topic (they travel like any message, linger included); returns the
        seconds until the next time."""
        if self._acc.buffered >= self._acc.max_buffered:
            return 0.1  # never block the sender on buffer space: count on, publish soon
        events = self._audit.events("produced", self.client_id)
        if events:
            self._acc.append_many(AUDIT_TOPIC, events, None, 0)
        return self._audit_interval_s


def close_open_producers() -> None:
    """Close every producer of this process still open, as at exit
    (:meth:`Producer.close_at_exit`, all of them at once, so that the wait
    is one delivery deadline, not one per producer)."""
    producers = list(_OPEN_PRODUCERS)
    if not producers:
        return
    threads = [threading.Thread(target=p.close_at_exit, name="raylog-exit-flush", daemon=True) for p in producers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def register_exit_hook(hook) -> None:
    """Run ``hook`` at interpreter exit **before** the interpreter shuts its
    thread pools down (``concurrent.futures`` refuses new work from then
    on, and ``atexit`` handlers run only after that): hooks registered
    here run before the threading module joins threads, latest first."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - an interpreter without it
        import atexit

        atexit.register(hook)
    else:
        register(hook)


register_exit_hook(close_open_producers)
