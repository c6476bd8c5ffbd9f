"""Fetch responses written directly: the listener's hot read path, without
kafka-python's generic schema codec (which :mod:`raylog.kafka.frames` uses
for every other API), so that the stored record batches a response carries
are copied once, into the frame, and never walked. Versions 4 to 12 are
served; 12 is *flexible*. Every integer is big-endian; a string is an i16
length then UTF-8 bytes, nullable bytes an i32 length (-1 for null) then
the bytes, an array an i32 count then its items. In version 12 they are
*compact* instead (an unsigned varint of length + 1 or count + 1, 0 for
null), the response header and every struct end with tagged fields (none
are written: one 0 byte each), and ``records`` is compact nullable bytes.
(The request, read by :mod:`raylog.kafka.frames`, gains
``last_fetched_epoch`` in version 12; raylog's offsets are byte positions
that no leader epoch truncates, so it is not used.)

Response frame:

=========================  ================  ================================
field                      type              notes
=========================  ================  ================================
size                       i32               bytes after this field
correlation_id             i32               the request's
header tagged fields                         version 12: none
throttle_time_ms           i32               0
error_code                 i16               version 7 and later; 0
session_id                 i32               version 7 and later; 0 (no
                                             fetch sessions)
responses                  array of:
  topic                    string
  partitions               array of:
    partition_index        i32
    error_code             i16
    high_watermark         i64
    last_stable_offset     i64               the partition's for a
                                             read_committed fetch
                                             (isolation_level 1), else
                                             the high watermark
    log_start_offset       i64               version 5 and later
    aborted_transactions   nullable array    of the read_committed
                                             records (count 0 otherwise):
      producer_id          i64
      first_offset         i64               of the aborted transaction's
                                             first batch (the client drops
                                             that producer's transactional
                                             batches from there up to its
                                             abort marker)
    preferred_read_replica i32               version 11 and later; -1
    records                nullable bytes    record batches (format 2, as
                                             stored; or converted, see
                                             :mod:`raylog.kafka.records`)
    tagged fields                            version 12: none
  tagged fields                              version 12: none
tagged fields                                version 12: none
=========================  ================  ================================

A partition's records may be a :class:`~raylog.kafka.file_ranges.FileRange`
(stored batches located in their segment file): the frame is then a list of
pieces, bytes and ranges, written in order (the ranges by ``sendfile``).

Pure functions; any thread.
"""

from __future__ import annotations

import struct

from raylog.kafka.file_ranges import FileRange
from raylog.kafka.frames import uvarint

LOWEST, HIGHEST = 4, 12
#: the first flexible version
FLEXIBLE = 12

_HEAD = struct.Struct(">iii")  # size, correlation_id, throttle_time_ms
_SIZE = struct.Struct(">i")
_TOP_V7 = struct.Struct(">hi")  # error_code, session_id
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION = struct.Struct(">ihqq")  # index, error_code, high_watermark, last_stable_offset
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_NO_ABORTED = _I32.pack(0)
_NO_REPLICA = _I32.pack(-1)


def encode_fetch_response(version: int, correlation_id: int, topics) -> bytes | list:
    """The response frame (size included) of a Fetch request of ``version``
    (4..12); ``topics`` holds ``(name, [(partition, error_code,
    high_watermark, log_start_offset, records[, last_stable_offset,
    aborted]), ...])`` (``aborted``: ``(producer id, first offset)`` pairs;
    without them the last stable offset is the high watermark and none is
    named), ``records`` any
    bytes-like object or a :class:`~raylog.kafka.file_ranges.FileRange`.
    Bytes when every ``records`` is bytes-like; else a list of the frame's
    pieces in order, each bytes or a ``FileRange``."""
    flexible = version >= FLEXIBLE
    count = (lambda n: uvarint(n + 1)) if flexible else _I32.pack
    parts = [b"", _TOP_V7.pack(0, 0) if version >= 7 else b"", count(len(topics))]
    append = parts.append
    for name, partitions in topics:
        data = name.encode("utf-8")
        append(uvarint(len(data) + 1) if flexible else _I16.pack(len(data)))
        append(data)
        append(count(len(partitions)))
        for index, code, hw, log_start, records, *txn in partitions:
            lso, aborted = txn if txn else (hw, ())
            fixed = _PARTITION.pack(index, code, hw, lso)
            if version >= 5:
                fixed += _I64.pack(log_start)
            if aborted:
                fixed += count(len(aborted)) + b"".join(
                    _ABORTED.pack(pid, first) + (b"\0" if flexible else b"") for pid, first in aborted)
            else:
                fixed += b"\x01" if flexible else _NO_ABORTED
            if version >= 11:
                fixed += _NO_REPLICA
            append(fixed + count(len(records)))
            append(records)
            if flexible:
                append(b"\0")  # the partition's tagged fields
        if flexible:
            append(b"\0")  # the topic's
    if flexible:
        append(b"\0")  # the body's
    head = _HEAD.pack(0, correlation_id, 0)
    if flexible:  # the header's (empty) tagged fields sit between the correlation id and the throttle time
        head = head[:8] + b"\0" + head[8:]
    size = sum(map(len, parts)) + len(head) - 4
    parts[0] = _SIZE.pack(size) + head[4:]
    ranges = [i for i, part in enumerate(parts) if type(part) is FileRange]
    if not ranges:
        return b"".join(parts)
    pieces, start = [], 0
    for i in ranges:
        pieces += [b"".join(parts[start:i]), parts[i]]
        start = i + 1
    if start < len(parts):
        pieces.append(b"".join(parts[start:]))
    return pieces
