"""Decoding of message sets, consumer side: ``(offset, timestamp, key, value)``
records, every CRC checked, wrappers unpacked (the format:
:mod:`raylog.storage.message`; the compiled fast path decodes runs of plain
messages, the code here is the reference).

Record batches (format 2, :mod:`raylog.storage.record_batch`) decode to the
same 4-tuples, as :class:`HeadedRecord`: a tuple that unpacks as before and
carries the record's ``headers`` (a list of ``(key, value or None)``, in
order) as an attribute; its ``value`` is ``None`` for a null value (a
tombstone), ``b""`` for an empty one, as its key. Record ``i`` of the batch at
``p`` reports ``p + i``. Control batches (transaction markers) are checked
and passed over: their records are not handed out, their bytes are consumed.
A buffer is of one format (a read lies within one segment), told by its
first bytes (:func:`~raylog.storage.record_batch.format_at`)."""

from __future__ import annotations

import functools
from itertools import repeat

from crc32c import crc32c

from raylog.errors import ConfigError, InvalidMessageError
from raylog.storage import message as _format
from raylog.storage.message import DEFAULT_MAX_MESSAGE_BYTES, CODEC_MASK, HEADER_FAST, SIZE_FIELD, STOP_HEADER
from raylog.storage.message_errors import corrupt_message, bad_header, tail_error, nested_wrapper, in_wrapper, inner_set
from raylog.storage.record_batch import HEADER_SIZE as BATCH_HEADER_SIZE
from raylog.storage.record_batch import LOG_OVERHEAD as BATCH_OVERHEAD
from raylog.storage.record_batch import MAX_BATCH_LENGTH, decode_batch, decode_batch_as, decode_batches_as, format_at

class HeadedRecord(tuple):
    """``(offset, timestamp, key, value)`` of a format-2 record, with
    ``headers`` (see the module docstring). Compares and unpacks as the plain
    4-tuple; not thread-confined (immutable once built)."""

    # (a tuple subclass with a __dict__: the four fields stay a plain tuple)

    def __new__(cls, offset, timestamp, key, value, headers):
        record = tuple.__new__(cls, (offset, timestamp, key, value))
        record.__dict__["headers"] = headers
        return record

    @property
    def headers(self) -> list:
        return self.__dict__["headers"]


def _decode_batches(buf, base_offset, max_message_bytes, partial_tail_ok, record_type, prefix, max_inflated_bytes):
    """:func:`decode_messages` of a buffer of record batches."""
    n = len(buf)
    bound = min(max_message_bytes, MAX_BATCH_LENGTH)
    records: list = []
    pos = 0
    runs = record_type is not None and len(prefix) == 2
    if runs:
        inner_type = getattr(record_type, "inner_type", record_type)
        # each batch's last record built as this type, its next offset the batch's end, in the same pass
        last_type = getattr(record_type, "last_type", None) if inner_type is not record_type else None
        prefix = tuple(prefix)
    while pos < n:
        if runs:
            # runs of plain batches in one compiled pass; the batch it stops at goes the way below
            run = decode_batches_as(buf, pos, n, max_message_bytes, inner_type, prefix, last_type)
            if run is None:
                runs = False
            else:
                rows, ends, stop = run
                if rows:
                    if inner_type is not record_type:
                        last_inner = record_type.last_inner
                        for i, next_offset in ends:
                            rows[i] = last_inner(rows[i], next_offset)
                    records.extend(rows)
                pos = stop
                if pos >= n:
                    break
        if n - pos < BATCH_HEADER_SIZE or n - pos < BATCH_OVERHEAD + int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True):
            length = int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True) if n - pos >= BATCH_OVERHEAD else 0
            if partial_tail_ok and length <= bound and (n - pos < BATCH_OVERHEAD or length >= BATCH_HEADER_SIZE - BATCH_OVERHEAD):
                break  # a batch cut by the end of the fetch: the next fetch reads it
        if record_type is not None and len(prefix) == 2:
            # the compiled path builds the messages in one pass (headers as a seventh item)
            inner_type = getattr(record_type, "inner_type", record_type)
            header, built = decode_batch_as(buf, pos, inner_type, tuple(prefix), max_message_bytes, max_inflated_bytes)
            if built is not None:
                pos += header.size
                if built:
                    if inner_type is not record_type:
                        built[-1] = record_type.last_inner(built[-1], header.next_offset)
                    records.extend(built)
                continue
        decoded = decode_batch(buf, pos, max_message_bytes=max_message_bytes, max_inflated_bytes=max_inflated_bytes)
        pos += decoded.header.size
        if decoded.control or not decoded.records:
            continue
        if record_type is None:
            records.extend(HeadedRecord(*r) for r in decoded.records)
            continue
        # as the inner messages of a wrapper: each but the last resumes at offset + 1, the last at the batch's end
        p0, p1 = prefix
        inner_type = getattr(record_type, "inner_type", record_type)
        with_headers = getattr(record_type, "with_headers", None)
        built = [tuple.__new__(inner_type, (p0, p1, r.offset, r.timestamp, r.key, r.value)) for r in decoded.records]
        if inner_type is not record_type:
            built[-1] = record_type.last_inner(built[-1], decoded.next_offset)
        if with_headers is not None:
            built = [with_headers(m, r.headers) for m, r in zip(built, decoded.records)]
        records.extend(built)
    return records, pos


def decode_messages(
    buf,
    base_offset: int,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    partial_tail_ok: bool = True,
    record_type: type | None = None,
    prefix: tuple = (),
    max_inflated_bytes: int | None = None,
) -> tuple[list[tuple[int, int, bytes | None, bytes]], int]:
    """Parse the whole messages of ``buf``, which starts at log offset ``base_offset``.

    Returns ``(records, consumed)``: each record is ``(offset, timestamp_ms,
    key, value)`` and ``consumed`` is the number of bytes of whole messages
    parsed, so the next fetch starts at ``base_offset + consumed``. Every CRC
    is checked (:class:`CorruptMessageError` with ``offset``), as are magic,
    attributes and key length (:class:`InvalidMessageError`) and the size
    bound (:class:`MessageTooLargeError`, before any allocation). A message
    cut off by the end of ``buf`` is left for the next fetch when
    ``partial_tail_ok`` (a fetch bounded by max_bytes ends like that), else
    it raises :class:`InvalidMessageError`. Wrappers are decompressed and
    the i-th inner message of a wrapper at ``w`` reports the offset ``w + i``
    (:func:`~raylog.storage.message.inner_offset`); a wrapper that would
    inflate past ``max_inflated_bytes`` (pass the topic's
    ``TopicConfig.max_inflated_limit``; default ``INNER_SET_FACTOR *
    max_message_bytes``) raises :class:`InflatedSizeTooLargeError` before it
    is inflated past that bound.

    With ``record_type`` (a tuple subclass, such as :class:`raylog.Message`)
    and a two-field ``prefix`` (the consumer passes topic and partition) each
    record is built directly as ``record_type((*prefix, offset, timestamp_ms,
    key, value))``, sparing the consumer a second pass.

    Record batches (format 2) decode as the module docstring says; with
    ``record_type`` their records are built as a wrapper's inner messages
    are (``record_type.inner_type`` / ``last_inner`` with the batch's end),
    and passed through ``record_type.with_headers(message, headers)`` when
    the type has it (else their headers are not kept).
    """
    if record_type is not None and len(prefix) != 2:
        raise ConfigError(f"prefix must hold two fields (topic, partition), got {prefix!r}")
    if format_at(buf) == 2:
        return _decode_batches(buf, base_offset, max_message_bytes, partial_tail_ok, record_type, prefix,
                               max_inflated_bytes)
    fast = _format._speedups  # looked up per call: tests swap the fast path
    kind = type(buf)
    if fast is not None and (kind is bytes or kind is bytearray or kind is memoryview and buf.c_contiguous):
        # read in place, without the copy to bytes
        return _decode_fast(
            fast, buf, base_offset, max_message_bytes, partial_tail_ok, True, record_type, prefix, max_inflated_bytes
        )
    data = buf if type(buf) is bytes else bytes(buf)
    return _decode_set(data, base_offset, max_message_bytes, partial_tail_ok, True, record_type, prefix, max_inflated_bytes)


def _decode_set(*args):
    """:func:`_decode` (the same arguments) by the fast path when there is one."""
    fast = _format._speedups  # looked up per call: tests swap the fast path
    if fast is None:
        return _decode(*args)
    return _decode_fast(fast, *args)


def _decode_fast(
    fast, buf, base_offset, max_message_bytes, partial_tail_ok, outer, record_type=None, prefix=(), max_inflated_bytes=None
):
    """:func:`_decode` of any contiguous buffer: the compiled loop for runs of
    plain messages, the reference for whatever it stops at."""
    p0, p1 = prefix if record_type is not None else (None, None)
    records, pos, status = fast.decode(buf, base_offset, max_message_bytes, record_type, p0, p1)
    if not status:
        return records, pos
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    while status == STOP_HEADER:
        # a wrapper, or a bad header: the reference decodes (or refuses) this one message
        end = pos + 4 + SIZE_FIELD.unpack_from(mv, pos)[0]
        one = bytes(mv[pos:end])
        more, _used = _decode(
            one, base_offset + pos, max_message_bytes, False, outer, record_type, prefix, max_inflated_bytes
        )
        records += more
        pos = end
        more, used, status = fast.decode(mv[pos:], base_offset + pos, max_message_bytes, record_type, p0, p1)
        records += more
        pos += used
    if status:
        # a bad CRC, a cut or oversized message, or arguments the fast path
        # leaves alone: the reference takes over from here
        rest = buf if pos == 0 and type(buf) is bytes else bytes(mv[pos:])
        more, used = _decode(
            rest, base_offset + pos, max_message_bytes, partial_tail_ok, outer, record_type, prefix, max_inflated_bytes
        )
        records += more
        pos += used
    return records, pos


def _decode(
    data: bytes,
    base_offset: int,
    max_message_bytes: int,
    partial_tail_ok: bool,
    outer: bool,
    record_type: type | None = None,
    prefix: tuple = (),
    max_inflated_bytes: int | None = None,
):
    new = tuple.__new__
    typed = record_type is not None
    p0, p1 = prefix if typed else (None, None)
    mv = memoryview(data)
    n = len(data)
    records: list[tuple[int, int, bytes | None, bytes]] = []
    append = records.append
    unpack = HEADER_FAST.unpack_from
    pos = 0
    last = n - 22
    # The CRC of a plain message without key covers 14 header bytes that depend
    # on the timestamp only (magic 1, attributes 0, key_length -1, all checked
    # from the unpacked fields): their CRC is computed once per run of equal
    # timestamps and continued over the value, which is sliced out anyway.
    # Every byte of every message is still covered by its CRC.
    run_ts = None
    run_crc = 0
    while pos <= last:
        size, crc, magic_attrs, ts, klen = unpack(data, pos)
        end = pos + 4 + size
        if end > n or size > max_message_bytes or size < 18:
            break
        if magic_attrs == 256 and klen == -1:
            value = data[pos + 22 : end]
            if ts != run_ts:
                run_ts = ts
                run_crc = crc32c(mv[pos + 8 : pos + 22])
            if crc32c(value, run_crc) != crc:
                raise corrupt_message(data, pos, base_offset + pos)
            if typed:
                append(new(record_type, (p0, p1, base_offset + pos, ts, None, value)))
            else:
                append((base_offset + pos, ts, None, value))
        elif crc32c(mv[pos + 8 : end]) != crc:
            raise corrupt_message(data, pos, base_offset + pos)
        elif magic_attrs != 256 or klen < -1 or klen > size - 18:
            magic, attrs = magic_attrs >> 8, magic_attrs & 0xFF
            err = bad_header(magic, attrs, klen, size, base_offset + pos)
            if err is not None:
                raise err
            if not outer:
                raise nested_wrapper(base_offset + pos)
            offset = base_offset + pos
            inner = inner_set(data, pos, end, attrs, klen, max_message_bytes, offset, max_inflated_bytes)
            # A record type may build inner messages as a type of their own
            # (``inner_type``) and the last one with the wrapper's end (``last_inner``),
            # as raylog.Message does for its next_offset.
            inner_type = getattr(record_type, "inner_type", record_type) if typed else None
            fast = _format._speedups
            if fast is not None:
                # the compiled loop numbers the inner messages offset + i itself, building
                # the records as they are handed out, when it reads the whole set and no
                # offset needs clamping (else the general way below, which also raises)
                inner_records, used, status = fast.decode(inner, offset, max_message_bytes, inner_type, p0, p1,
                                                          True)
                if not status and used == len(inner) and offset + len(inner_records) - 1 <= base_offset + end - 1:
                    if inner_records and inner_type is not record_type:
                        inner_records[-1] = record_type.last_inner(inner_records[-1], base_offset + end)
                    records += inner_records
                    pos = end
                    continue
            try:
                inner_records, _consumed = _decode_set(inner, 0, max_message_bytes, False, False)
            except InvalidMessageError as err:
                raise in_wrapper(err, attrs & CODEC_MASK, offset) from None
            # the i-th inner message reports offset + i (clamped to the
            # wrapper's last byte for an old wrapper shorter than its count)
            tail = base_offset + end - 1
            count = len(inner_records)
            if count and offset + count - 1 <= tail:
                # no clamp: the columns zipped with the offsets, every tuple built in C
                _, stamps, keys, values = zip(*inner_records)
                offsets = range(offset, offset + count)
                if typed:
                    records.extend(map(functools.partial(new, inner_type),
                                       zip(repeat(p0), repeat(p1), offsets, stamps, keys, values)))
                    if inner_type is not record_type:
                        records[-1] = record_type.last_inner(records[-1], base_offset + end)
                else:
                    records.extend(zip(offsets, stamps, keys, values))
            elif typed:
                records.extend([new(record_type, (p0, p1, min(offset + i, tail), its, key, value))
                                for i, (_o, its, key, value) in enumerate(inner_records)])
            else:
                records.extend([(min(offset + i, tail), its, key, value)
                                for i, (_o, its, key, value) in enumerate(inner_records)])
        else:
            kend = pos + 22 + klen
            if typed:
                append(new(record_type, (p0, p1, base_offset + pos, ts, data[pos + 22 : kend], data[kend:end])))
            else:
                append((base_offset + pos, ts, data[pos + 22 : kend], data[kend:end]))
        pos = end
    if pos < n:
        err = tail_error(data, pos, n, max_message_bytes, base_offset + pos)
        if not partial_tail_ok or not err.details.get("partial"):
            raise err
    return records, pos
