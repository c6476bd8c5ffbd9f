"""A producer batch: the messages of one topic-partition that travel as one
message set, with the future they share.

Thread-safety: guarded by the accumulator's lock until sealed; then only
the sender's worker draining its partition reads it.
"""

from __future__ import annotations

import time

from raylog.producer.futures import BatchFuture


def add_key_size(size: int, key: bytes | None) -> int:
    return size + len(key) if key is not None else size


class ProducerBatch:
    """Messages for one topic-partition that travel as one message set."""

    __slots__ = ("topic", "partition", "values", "keys", "timestamps", "created", "deadline", "size", "limit",
                 "future")

    def __init__(self, topic: str, partition: int, linger_s: float | None, limit: int, compressed: bool, values=None):
        self.topic = topic
        self.partition = partition
        self.values: list[bytes] = [] if values is None else values
        self.keys: list[bytes | None] | None = None  # made when a keyed message joins
        self.timestamps: list[int] | None = None  # made when a message brings its own
        self.created = time.time()
        # (linger_s None: sealed as it is made, no linger deadline)
        self.deadline = 0.0 if linger_s is None else time.monotonic() + linger_s
        self.size = 0  # bytes of the uncompressed message set so far
        self.limit = limit  # max_message_bytes of the topic
        self.future = BatchFuture(topic, partition, self.values, compressed)

    def __len__(self) -> int:
        return len(self.values)
