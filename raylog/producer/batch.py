"""A producer batch: the messages of one topic-partition that travel as one
record batch (format 2, docs/design.md §2), with the future they share.

Thread-safety: guarded by the accumulator's lock until sealed; then only
the sender's worker draining its partition reads it.
"""

from __future__ import annotations

import time

from raylog.producer.futures import BatchFuture


#: what a record batch adds to the messages' sizes as the accumulator counts
#: them (docs/design.md §2: a batch's header after its first 12 bytes is 49
#: bytes; each record's own fields, at most 22 bytes for the sizes a batch
#: holds, are counted per message as format 1's header was, so a batch is
#: sealed with room for its header: ``limit`` is max_message_bytes minus this)
BATCH_OVERHEAD = 49


def batch_limit(max_message_bytes: int) -> int:
    """The accumulator's bound on a batch's counted size, for a topic's ``max_message_bytes``."""
    return max(1, max_message_bytes - BATCH_OVERHEAD)


def headers_size(headers) -> int:
    """Bytes a record's headers add (their keys and values, and a varint of up to 5 bytes for each length)."""
    return sum(10 + len(k.encode()) + (len(v) if v is not None else 0) for k, v in headers)


def add_key_size(size: int, key: bytes | None) -> int:
    return size + len(key) if key is not None else size


class ProducerBatch:
    """Messages for one topic-partition that travel as one message set."""

    __slots__ = ("topic", "partition", "values", "keys", "timestamps", "headers", "created", "deadline", "size", "limit",
                 "future")

    def __init__(self, topic: str, partition: int, linger_s: float | None, limit: int, compressed: bool, values=None):
        self.topic = topic
        self.partition = partition
        self.values: list[bytes] = [] if values is None else values
        self.keys: list[bytes | None] | None = None  # made when a keyed message joins
        self.timestamps: list[int] | None = None  # made when a message brings its own
        self.headers: dict[int, list] | None = None  # message index -> its headers, made when one has any
        self.created = time.time()
        # (linger_s None: sealed as it is made, no linger deadline)
        self.deadline = 0.0 if linger_s is None else time.monotonic() + linger_s
        self.size = 0  # bytes of the uncompressed message set so far
        self.limit = limit  # batch_limit(max_message_bytes of the topic)
        self.future = BatchFuture(topic, partition, self.values, compressed)

    def __len__(self) -> int:
        return len(self.values)
