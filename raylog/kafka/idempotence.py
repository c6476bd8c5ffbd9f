"""Idempotent Kafka producers: InitProducerId, and a Produce batch's
producer id and sequence carried down to raylog's partition.

Producer ids. raylog has no producer-id allocator: its own idempotent
producers draw a random non-negative i63 (``new_producer_id`` in
:mod:`raylog.producer.sender`: no coordination), and so does
InitProducerId here, from the same space. A Kafka producer id never reaches
a partition as it is, though (below), so it cannot collide with a raylog
producer's there. InitProducerId answers epoch 0; asked again with the id
and epoch it holds (version 3 and later, librdkafka's epoch bump after an
unresolved error), it answers the same id with the next epoch, whose
sequences start again at 0. Transactions are refused (raylog has none):
FindCoordinator for a transactional id (key type 1) and InitProducerId
with one are answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which Kafka
clients take as fatal, so ``init_transactions()`` fails at once (with the
reason as FindCoordinator's error message) instead of retrying until its
timeout; the listener logs why.

Sequence units. Kafka numbers *records*: a batch of ``n`` records with
``baseSequence s`` is followed by the batch with ``baseSequence s + n``.
raylog numbers *message sets*: a PRODUCE version 1 carries one set and the
partition expects ``last + 1`` (:mod:`raylog.transfer.protocol`,
:mod:`raylog.storage.producer_state`). A Kafka batch is stored as one raylog
set (:mod:`raylog.kafka.records`), so the listener translates: for each
Kafka producer id, epoch and topic-partition (a :class:`_Stream`) it keeps a
raylog producer id of its own (random i63, as raylog's producers draw) and
numbers that stream's batches 0, 1, 2, ... in the order their Kafka
sequences follow each other:

* ``baseSequence`` equal to the next expected (or the stream is new): the
  batch gets the next raylog sequence;
* a batch seen before (same ``baseSequence`` and record count, among the
  last :data:`RECENT_BATCHES`): the raylog sequence it got then -- a
  retry; the partition stores it once and answers the first store's base
  offset for the copy, which is answered as Kafka does for a duplicate:
  NONE with that base offset;
* ahead of the next expected: OUT_OF_ORDER_SEQUENCE_NUMBER (nothing sent);
* behind it and no longer remembered: DUPLICATE_SEQUENCE_NUMBER (nothing
  sent; librdkafka takes it as delivered before).

The partition's own answers map the same way: ``OutOfOrderSequenceError``
(the set before it never got stored) to OUT_OF_ORDER_SEQUENCE_NUMBER,
``DuplicateSequenceError`` to DUPLICATE_SEQUENCE_NUMBER. The deduplication
itself is the partition's (kept with its log, replicated, across partition
restarts and leader changes); the translation lives in the listener that
received the batches. So a retry that reaches another listener (Metadata
named another one for the partition, or the listener's process was started
again) starts a new stream with a new raylog id: a batch resent across that
change may be stored twice, as with a Kafka producer whose id the broker
forgot. At most :data:`MAX_STREAMS` streams are kept per listener (the one
used least recently is forgotten first, with the same consequence).

Thread-safety: :class:`SequenceMap` is shared by a listener's sessions and
locks its own state; the produce request itself is sent outside the lock.
"""

from __future__ import annotations

import logging
import random
import struct
import threading
from collections import OrderedDict, deque

from kafka.protocol.metadata import FindCoordinatorResponse
from kafka.protocol.producer import InitProducerIdResponse

from raylog.errors import DuplicateSequenceError, OutOfOrderSequenceError
from raylog.kafka.records import RecordsRefused
from raylog.transfer.protocol import NO_PRODUCER_ID, NO_SEQUENCE

log = logging.getLogger(__name__)

#: batches of a stream remembered for retries (librdkafka keeps at most 5 in flight)
RECENT_BATCHES = 32
#: streams (Kafka producer id, epoch, topic, partition) kept per listener
MAX_STREAMS = 10_000
_MAX_PRODUCER_ID = (1 << 63) - 1
_MAX_EPOCH = (1 << 15) - 1
_SEQUENCE_SPACE = 1 << 31

# Kafka error codes
NONE = 0
INVALID_RECORD = 87
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
#: FindCoordinator's key type of a transactional id
TRANSACTION_KEY_TYPE = 1
NO_TRANSACTIONS = ("raylog has no transactions: use enable.idempotence without transactional.id "
                   "(a resent batch is stored once)")

#: a record batch's fields 1-2 and 10-13 (see :mod:`raylog.kafka.records`):
#: baseOffset i64, batchLength i32 ... producerId i64 at byte 43,
#: producerEpoch i16 at 51, baseSequence i32 at 53, recordCount i32 at 57
_PREFIX = struct.Struct(">qi")
_IDENTITY = struct.Struct(">qhii")
_IDENTITY_AT = 43
_HEADER_SIZE = 61


def new_producer_id() -> int:
    """A random non-negative i63, drawn as raylog's own producers draw theirs."""
    return random.SystemRandom().randint(0, _MAX_PRODUCER_ID)


def batch_identity(data: bytes) -> tuple[int, int, int, int]:
    """``(producer id, epoch, base sequence, record count)`` of the record
    batches in ``data`` (a Produce partition's records). ``(-1, -1, -1,
    count)`` when they carry no producer id; raises :class:`RecordsRefused`
    for an idempotent request of more than one batch (Kafka allows one)."""
    pos, total, batches, identity = 0, len(data), 0, None
    while pos + _HEADER_SIZE <= total:
        _, length = _PREFIX.unpack_from(data, pos)
        found = _IDENTITY.unpack_from(data, pos + _IDENTITY_AT)
        identity = found if identity is None else identity
        batches += 1
        pos += _PREFIX.size + max(length, 0)
    if identity is None or identity[0] < 0:
        return -1, -1, -1, 0
    if batches != 1:
        raise RecordsRefused(INVALID_RECORD, f"an idempotent produce carries {batches} record batches for one "
                                             f"partition; Kafka allows one")
    return identity


class _Stream:
    """One Kafka producer's batches to one topic-partition under one epoch."""

    __slots__ = ("raylog_id", "next_kafka", "next_raylog", "recent")

    def __init__(self, first_sequence: int):
        self.raylog_id = new_producer_id()
        self.next_kafka = first_sequence
        self.next_raylog = 0
        #: ``(base sequence, record count, raylog sequence)`` of the last batches
        self.recent: deque = deque(maxlen=RECENT_BATCHES)


class SequenceMap:
    """The Kafka-to-raylog sequence translation of one listener (see the
    module docstring)."""

    def __init__(self, max_streams: int = MAX_STREAMS):
        self._lock = threading.Lock()
        self._streams: OrderedDict[tuple, _Stream] = OrderedDict()
        self._max = max_streams

    def __len__(self) -> int:
        return len(self._streams)

    def assign(self, producer_id: int, epoch: int, topic: str, partition: int, base_sequence: int,
               count: int) -> tuple[int, int]:
        """``(raylog producer id, raylog sequence)`` for a batch; raises
        :class:`RecordsRefused` for a gap or a forgotten duplicate."""
        key = (producer_id, epoch, topic, partition)
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                stream = self._streams[key] = _Stream(base_sequence)
                if len(self._streams) > self._max:
                    self._streams.popitem(last=False)
            else:
                self._streams.move_to_end(key)
            if base_sequence == stream.next_kafka:
                sequence = stream.next_raylog
                stream.recent.append((base_sequence, count, sequence))
                stream.next_kafka = (base_sequence + count) % _SEQUENCE_SPACE
                stream.next_raylog += 1
                return stream.raylog_id, sequence
            for seen, seen_count, sequence in stream.recent:
                if seen == base_sequence and seen_count == count:
                    return stream.raylog_id, sequence  # a retry: the partition dedups it
            ahead = (base_sequence - stream.next_kafka) % _SEQUENCE_SPACE < _SEQUENCE_SPACE // 2
            if ahead:
                raise RecordsRefused(OUT_OF_ORDER_SEQUENCE_NUMBER,
                                     f"producer {producer_id} sent sequence {base_sequence} to {topic}-{partition} "
                                     f"but the next expected is {stream.next_kafka}; not stored")
            raise RecordsRefused(DUPLICATE_SEQUENCE_NUMBER,
                                 f"producer {producer_id} sent sequence {base_sequence} to {topic}-{partition} "
                                 f"again; it is older than the batches remembered, not stored again")


def translate(sequences: SequenceMap, topic: str, partition: int, records: bytes) -> tuple[int, int]:
    """``(raylog producer id, raylog sequence)`` to send ``records`` (a
    Produce partition's batch) under: ``(NO_PRODUCER_ID, NO_SEQUENCE)``
    when the batch carries no Kafka producer id. Raises
    :class:`RecordsRefused` for a sequence the translation refuses (then
    nothing is to be sent)."""
    producer_id, epoch, base_sequence, count = batch_identity(records)
    if producer_id < 0:
        return NO_PRODUCER_ID, NO_SEQUENCE
    return sequences.assign(producer_id, epoch, topic, partition, base_sequence, count)


def answer(result) -> int:
    """The base offset of the partition's answer to a set sent under a
    :func:`translate`d identity (what ``read_set_reply`` returns: the first
    store's offset for a duplicate); raises :class:`RecordsRefused` for a
    sequence the partition refuses and the typed error of any other
    refusal."""
    if isinstance(result, OutOfOrderSequenceError):
        raise RecordsRefused(OUT_OF_ORDER_SEQUENCE_NUMBER, str(result).splitlines()[0])
    if isinstance(result, DuplicateSequenceError):
        raise RecordsRefused(DUPLICATE_SEQUENCE_NUMBER, str(result).splitlines()[0])
    if isinstance(result, Exception):
        raise result
    return result


def init_producer_id(body, version: int):
    """The InitProducerId answer (see the module docstring)."""
    if body.transactional_id is not None:
        log.info("InitProducerId with transactional id %r refused: raylog has no transactions",
                 body.transactional_id)
        return InitProducerIdResponse[version](throttle_time_ms=0, error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                               producer_id=-1, producer_epoch=-1)
    held, epoch = getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1)
    if held is not None and held >= 0 and epoch is not None and 0 <= epoch < _MAX_EPOCH:
        return InitProducerIdResponse[version](throttle_time_ms=0, error_code=NONE, producer_id=held,
                                               producer_epoch=epoch + 1)
    return InitProducerIdResponse[version](throttle_time_ms=0, error_code=NONE, producer_id=new_producer_id(),
                                           producer_epoch=0)


def no_transaction_coordinator(body, version: int):
    """FindCoordinator's answer for a transactional id: refused (see the module docstring)."""
    log.info("FindCoordinator for transactional id %r refused: raylog has no transactions", body.key)
    return FindCoordinatorResponse[version](throttle_time_ms=0, error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                            error_message=NO_TRANSACTIONS, node_id=-1, host="", port=-1)
