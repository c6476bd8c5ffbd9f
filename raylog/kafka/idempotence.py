"""Idempotent Kafka producers: InitProducerId, and the answers to a
Produce of an idempotent batch.

Producer ids. raylog has no producer-id allocator: its own idempotent
producers draw a random non-negative i63 (``new_producer_id`` in
:mod:`raylog.producer.sender`: no coordination, a collision among even a
billion ids has odds below 1e-10), and so does InitProducerId here, from
the same space, on any listener: ids are unique cluster-wide in the same
sense, without a round trip to ZooKeeper. InitProducerId answers epoch 0;
asked again with the id and epoch it holds (version 3 and later,
librdkafka's epoch bump after an unresolved error), it answers the same id
with the next epoch, whose sequences start again at 0. InitProducerId with a
transactional id is not served here: the transaction coordinator hands
those identities out (:mod:`raylog.kafka.transactions`).

Sequences. A Kafka batch is stored as it came (:mod:`raylog.kafka.records`),
its producerId, producerEpoch and baseSequence with it, and the partition
judges it by those fields against the producer state it keeps from its own
log (:mod:`raylog.storage.batch_producers`: rebuilt from the log's batches,
so it holds through any listener, a listener's restart, a partition's
restart and a leader change). The listener keeps no state of its own: a
retry that reaches another listener is recognised all the same. The
partition's answers map to Kafka's (:func:`answer`): a duplicate of one of
the producer's last batches is NONE with the offset of its first store (what
a Kafka broker answers), ``OutOfOrderSequenceError`` (a batch before it
never got stored) OUT_OF_ORDER_SEQUENCE_NUMBER, ``DuplicateSequenceError``
(older than the batches remembered) DUPLICATE_SEQUENCE_NUMBER.

Pure functions; any thread.
"""

from __future__ import annotations

import logging
import random

from kafka.protocol.producer import InitProducerIdResponse

from raylog.errors import DuplicateSequenceError, OutOfOrderSequenceError
from raylog.kafka.records import RecordsRefused

log = logging.getLogger(__name__)

_MAX_PRODUCER_ID = (1 << 63) - 1
_MAX_EPOCH = (1 << 15) - 1

# Kafka error codes
NONE = 0
INVALID_RECORD = 87
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46


def new_producer_id() -> int:
    """A random non-negative i63, drawn as raylog's own producers draw theirs."""
    return random.SystemRandom().randint(0, _MAX_PRODUCER_ID)


def answer(result) -> int:
    """The base offset of the partition's answer to a stored batch (what
    ``read_set_reply`` returns: the first store's offset for a duplicate);
    raises :class:`RecordsRefused` for a sequence the partition refuses and
    the typed error of any other refusal."""
    if isinstance(result, OutOfOrderSequenceError):
        raise RecordsRefused(OUT_OF_ORDER_SEQUENCE_NUMBER, str(result).splitlines()[0])
    if isinstance(result, DuplicateSequenceError):
        raise RecordsRefused(DUPLICATE_SEQUENCE_NUMBER, str(result).splitlines()[0])
    if isinstance(result, Exception):
        raise result
    return result


def init_producer_id(body, version: int):
    """The InitProducerId answer (see the module docstring)."""
    held, epoch = getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1)
    if held is not None and held >= 0 and epoch is not None and 0 <= epoch < _MAX_EPOCH:
        return InitProducerIdResponse[version](throttle_time_ms=0, error_code=NONE, producer_id=held,
                                               producer_epoch=epoch + 1)
    return InitProducerIdResponse[version](throttle_time_ms=0, error_code=NONE, producer_id=new_producer_id(),
                                           producer_epoch=0)

