"""The message a consumer receives.

A :class:`Message` is an immutable tuple (cheap to build on the consumer's
hot path) with named fields:

``topic``, ``partition``
    where it was read from;
``offset``
    its byte offset in the partition log. Messages that arrived inside one
    compressed wrapper all report the wrapper's offset, so a consumer can
    only commit at wrapper boundaries: committing such an offset re-delivers
    the whole wrapper after a restart (at-least-once);
``key``, ``value``
    bytes (``key`` is ``None`` when the producer sent none);
``timestamp``
    the producer's create time, milliseconds since the epoch.

``msg.next_offset`` is not stored: the consumer tracks positions itself.
"""

from __future__ import annotations

from typing import NamedTuple


class Message(NamedTuple):
    # The field order follows the storage records (offset, timestamp, key,
    # value) so that the decoder builds messages in one pass.
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes

    def __repr__(self) -> str:
        value = self.value if len(self.value) <= 40 else self.value[:37] + b"..."
        return (
            f"Message(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"timestamp={self.timestamp}, key={self.key!r}, value={value!r})"
        )
