"""Transaction markers: Kafka's control batches (docs/design.md §2 and §6).

A transaction ends on a partition with a **marker**: a record batch of
format 2 (:mod:`raylog.storage.record_batch`) with attributes bit 4
(transactional) and bit 5 (control) set, the producer's producerId and
producerEpoch, baseSequence -1 and one record, whose key and value are
Kafka's ``EndTransactionMarker``, big-endian::

  key (4 bytes)
     field             type   bytes   meaning
  1. version           i16    0..2    0
  2. type              i16    2..4    0: abort, 1: commit (Kafka's ControlRecordType)

  value (6 bytes)
     field             type   bytes   meaning
  3. version           i16    0..2    0
  4. coordinatorEpoch  i32    2..6    the epoch of the transaction coordinator that wrote it

A marker is written only by the partition, for its leader's transaction
coordinator (:meth:`raylog.storage.log.PartitionLog.append_marker`);
clients never send one (:class:`~raylog.errors.ControlBatchError`). Readers
hand no record of a control batch to consumers. A later version of the
value (Kafka's flexible one, with tagged fields after field 4) is read
by its first two fields.

Pure functions; any thread.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from raylog.errors import InvalidMessageError
from raylog.storage.record_batch import decode_batch, encode_batch

__all__ = ["ABORT", "COMMIT", "Marker", "encode_marker", "decode_marker"]

#: the marker types of field 2
ABORT = 0
COMMIT = 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class Marker(NamedTuple):
    """A decoded marker: whether it commits, and the coordinator's epoch."""

    commit: bool
    coordinator_epoch: int


def encode_marker(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                  timestamp_ms: int | None = None) -> bytes:
    """The control batch that ends ``producer_id``'s transaction (not stamped yet)."""
    key = _KEY.pack(0, COMMIT if commit else ABORT)
    value = _VALUE.pack(0, coordinator_epoch)
    return encode_batch([value], keys=[key], timestamp_ms=timestamp_ms, producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=-1, transactional=True, control=True)


def decode_marker(data, pos: int = 0) -> Marker:
    """The marker of the control batch at ``pos`` (checked whole first);
    :class:`InvalidMessageError` when it is not a control batch or its
    record is not an ``EndTransactionMarker``."""
    batch = decode_batch(data, pos)
    header = batch.header
    if not header.control or len(batch.records) != 1:
        raise InvalidMessageError(
            f"the batch at offset {header.base_offset} is not a transaction marker (control bit "
            f"{header.control}, {header.count} records)", offset=header.base_offset)
    record = batch.records[0]
    key, value = record.key, record.value
    if key is None or len(key) < _KEY.size or value is None or len(value) < _VALUE.size:
        raise InvalidMessageError(f"the marker at offset {header.base_offset} has a key or value too short",
                                  offset=header.base_offset)
    _version, kind = _KEY.unpack_from(key)
    if kind not in (ABORT, COMMIT):
        raise InvalidMessageError(f"the control record at offset {header.base_offset} has type {kind}: "
                                  f"not a transaction marker (0 abort, 1 commit)", offset=header.base_offset)
    _version, coordinator_epoch = _VALUE.unpack_from(value)
    return Marker(kind == COMMIT, coordinator_epoch)
