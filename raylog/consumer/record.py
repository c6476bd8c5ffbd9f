"""The message a consumer receives.

A :class:`Message` is an immutable tuple (cheap to build on the consumer's
hot path) with named fields:

``topic``, ``partition``
    where it was read from;
``offset``
    its byte offset in the partition log;
``key``, ``value``
    bytes (``key`` is ``None`` when the producer sent none);
``timestamp``
    the producer's create time, milliseconds since the epoch;

and one derived property:

``next_offset``
    where to resume after this message: store it (or commit it) once the
    message is processed, as Kafka users store ``offset + 1``. For a plain
    message it is ``offset + 22 + len(key) + len(value)`` (the size field,
    the fixed header and the bytes; docs/design.md §2).

**The wrapper rule.** Messages that arrived inside one compressed wrapper all
report the wrapper's ``offset`` (a consumer can only resume at a wrapper
boundary). Their ``next_offset`` is the wrapper's offset for every inner
message but the last, and the offset after the wrapper for the last one: so
resuming from the ``next_offset`` of a processed message never skips an
unprocessed one; it may deliver the wrapper's earlier messages again
(at-least-once).
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
    value: bytes

    @property
    def next_offset(self) -> int:
        """Where to resume after this message (see the module docstring)."""
        return self.offset + HEADER_BYTES + (len(self.key) if self.key is not None else 0) + len(self.value)

    def __repr__(self) -> str:
        value = self.value if len(self.value) <= 40 else self.value[:37] + b"..."
        return (
            f"Message(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"timestamp={self.timestamp}, key={self.key!r}, value={value!r})"
        )


class WrappedMessage(Message):
    """A message that came inside a compressed wrapper: its ``next_offset``
    follows the wrapper rule and is stored, not derived."""

    # (a tuple subclass with a __dict__: the six fields stay a plain tuple)

    @property
    def next_offset(self) -> int:
        return self.__dict__["_next_offset"]


def with_next_offsets(records: list, end: int) -> list:
    """Give each decoded message of a fetch (ending at byte ``end``) its
    ``next_offset``: the offset of the record after it, or ``end``. Messages
    whose derived value differs (the inner messages of a wrapper) become
    :class:`WrappedMessage`. Works in place and returns ``records``."""
    n = len(records)
    for i, m in enumerate(records):
        nxt = records[i + 1][2] if i + 1 < n else end
        if m[2] + HEADER_BYTES + (len(m[4]) if m[4] is not None else 0) + len(m[5]) != nxt:
            wrapped = tuple.__new__(WrappedMessage, m)
            wrapped.__dict__["_next_offset"] = nxt
            records[i] = wrapped
    return records
