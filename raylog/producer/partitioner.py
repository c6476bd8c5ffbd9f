"""Key → partition, the same in every producer.

A keyed message goes to ``crc32c(key) mod partitions``. CRC32C (Castagnoli,
the checksum of the message format, from the ``crc32c`` package) is an
unsigned 32-bit value, so the modulo is never negative, and it is the same
in every process and on every machine, unlike Python's salted ``hash()``.

Keyless messages stick to one partition per topic until a batch of them is
handed to the sender, then move to another chosen at random: batches stay
full while load still spreads evenly over time.
"""

from __future__ import annotations

import random

from crc32c import crc32c

from raylog.errors import ConfigError


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``: stable everywhere."""
    if partitions <= 0:
        raise ConfigError(f"a topic has at least one partition, got {partitions}")
    return crc32c(key) % partitions


class StickyPartitioner:
    """Chooses partitions for keyless messages. Not thread-safe: the
    producer calls it under its own lock."""

    __slots__ = ("_current", "_random")

    def __init__(self, seed: int | None = None):
        self._current: dict[str, int] = {}
        self._random = random.Random(seed)

    def partition(self, topic: str, partitions: int) -> int:
        current = self._current.get(topic)
        if current is None or current >= partitions:
            current = self._current[topic] = self._random.randrange(partitions)
        return current

    def batch_sent(self, topic: str, partitions: int) -> None:
        """Move keyless messages of ``topic`` to another partition."""
        if partitions > 1:
            old = self._current.get(topic)
            new = self._random.randrange(partitions - 1)
            self._current[topic] = new + 1 if old is not None and new >= old else new
