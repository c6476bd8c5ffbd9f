"""The message a consumer receives.

A :class:`Message` is an immutable tuple (cheap to build on the consumer's
hot path) with named fields:

``topic``, ``partition``
    where it was read from;
``offset``
    its byte offset in the partition log;
``key``, ``value``
    bytes (``key`` is ``None`` when the producer sent none; ``value`` is
    ``None`` for a format-2 record with a null value, a tombstone, which is
    distinct from an empty value ``b""``);
``timestamp``
    the producer's create time, milliseconds since the epoch;
``headers``
    a format-2 record's headers, in order, duplicates kept: a list of
    ``(str, bytes | None)`` pairs; the empty tuple ``()`` for a format-1
    message and a record without headers (the decoder builds format-1
    messages as six-tuples, and ``headers`` reads as ``()`` for them; a
    record with headers is a seven-tuple, built by ``Message.with_headers``);

and one derived property:

``next_offset``
    where to resume after this message: store it (or commit it) once the
    message is processed, as Kafka users store ``offset + 1``. For a plain
    message it is ``offset + 22 + len(key) + len(value)`` (the size field,
    the fixed header and the bytes; docs/design.md §2). A format-2 record
    follows the wrapper rule below with its batch as the wrapper: record i of
    the batch at ``p`` has offset ``p + i``, its ``next_offset`` is
    ``p + i + 1``, and the batch's next offset (``p + lastOffsetDelta + 1``)
    for its last record.

**The wrapper rule.** The i-th message (from 0) that arrived inside a
compressed wrapper at offset ``w`` reports the offset ``w + i`` (every
message has an offset of its own; docs/design.md §2). Its ``next_offset`` is
``w + i + 1`` while messages remain in the wrapper, and the offset after the
wrapper for the last one. A position inside a wrapper is fetched from the
wrapper's start and the messages before it are skipped, so resuming from the
``next_offset`` of a processed message gives exactly the next one. (A wrapper
written before its padding, shorter than its count, clamps its offsets to
its last byte: its messages from there on are delivered again after a resume
inside it, at-least-once.)
"""

from __future__ import annotations

from typing import NamedTuple

#: bytes of a message that are not key or value: size, crc, magic,
#: attributes, timestamp, key length (docs/design.md §2)
HEADER_BYTES = 4 + 4 + 1 + 1 + 8 + 4


class Message(NamedTuple):
    # The field order follows the storage records (offset, timestamp, key,
    # value) so that the decoder builds messages in one pass.
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    # ``headers`` is a property (below), not a field: format-1 messages stay
    # six-tuples, equal however they were built; a format-2 record with
    # headers is a seventh item, set by the decoder's ``with_headers`` hook.

    @property
    def next_offset(self) -> int:
        """Where to resume after this message (see the module docstring)."""
        return self.offset + HEADER_BYTES + (len(self.key) if self.key is not None else 0) + len(self.value)

    def __repr__(self) -> str:
        value = self.value if self.value is None or len(self.value) <= 40 else self.value[:37] + b"..."
        headers = f", headers={self.headers!r}" if self.headers else ""
        return (
            f"Message(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"timestamp={self.timestamp}, key={self.key!r}, value={value!r}{headers})"
        )


class WrappedMessage(Message):
    """A message that came inside a compressed wrapper: its ``next_offset``
    follows the wrapper rule and is stored, not derived."""

    # (a tuple subclass with a __dict__: the six fields stay a plain tuple)

    @property
    def next_offset(self) -> int:
        return self.__dict__["_next_offset"]


class InnerMessage(Message):
    """A message inside a compressed wrapper, before its last: its
    ``next_offset`` is ``offset + 1`` (the wrapper rule), derived, so the
    decoder builds it as it builds a :class:`Message`."""

    __slots__ = ()

    @property
    def next_offset(self) -> int:
        return self.offset + 1


def last_inner(message: tuple, next_offset: int) -> WrappedMessage:
    wrapped = tuple.__new__(WrappedMessage, message)
    wrapped.__dict__["_next_offset"] = next_offset
    return wrapped


def _headers(message: tuple):
    # the decoder builds format-1 messages as six-tuples (no headers slot)
    return message[6] if len(message) > 6 else ()


Message.headers = property(_headers, doc="the record's headers: ``(str, bytes | None)`` pairs, ``()`` for none")


def _with_headers(message: tuple, headers: list):
    """The decoder's hook for a format-2 record: ``message`` (of any Message
    type, as built) with its headers, keeping its type and ``next_offset``."""
    if not headers:
        return message
    with_h = tuple.__new__(type(message), (*message[:6], list(headers)))
    if type(message) is WrappedMessage:
        with_h.__dict__["_next_offset"] = message.__dict__["_next_offset"]
    return with_h


Message.with_headers = staticmethod(_with_headers)

# What the decoder builds for the inner messages of a wrapper when it is
# asked for Messages (raylog.storage.decoding: every one but the last as
# ``inner_type``, the last through ``last_inner`` with the wrapper's end).
Message.inner_type = InnerMessage
Message.last_inner = staticmethod(last_inner)
# The compiled decoder builds the last record of a batch directly as this
# type, with ``_next_offset`` in its ``__dict__`` (as ``last_inner`` does).
Message.last_type = WrappedMessage


def with_next_offsets(records: list, end: int) -> list:
    """Give each decoded message of a fetch (ending at byte ``end``) its
    ``next_offset``: the offset of the record after it, or ``end``. Messages
    whose derived value differs (the inner messages of a wrapper the decoder
    built as plain messages) become :class:`WrappedMessage`; those it built
    as :class:`InnerMessage` or :class:`WrappedMessage` carry theirs. Works
    in place and returns ``records``."""
    n = len(records)
    plain = Message
    for i, m in enumerate(records):
        if type(m) is not plain:
            continue
        nxt = records[i + 1][2] if i + 1 < n else end
        if m[2] + HEADER_BYTES + (len(m[4]) if m[4] is not None else 0) + len(m[5]) != nxt:
            records[i] = last_inner(m, nxt)
    return records
