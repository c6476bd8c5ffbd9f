"""Key → partition, the same in every producer.

A keyed message goes to ``crc32c(key) mod partitions``
(:func:`raylog.storage.stable_hash.stable_bucket`, shared with the placement). CRC32C (Castagnoli,
the checksum of the message format, from the ``crc32c`` package) is an
unsigned 32-bit value, so the modulo is never negative, and it is the same
in every process and on every machine, unlike Python's salted ``hash()``.

A producer may choose another key hash (``partitioner=``), so that it
agrees on a key's partition with Kafka clients writing the same topic
through the Kafka front door:

=============  ===================================================  ==========================
name           partition of a key                                    the same as
=============  ===================================================  ==========================
``crc32c``     ``crc32c(key) mod n`` (the default)                   raylog's producers, Spark's sink
``murmur2``    ``(murmur2(key) & 0x7fffffff) mod n``                 Kafka's Java client, kafka-python,
                                                                     librdkafka's ``murmur2_random``
``crc32``      ``crc32(key) mod n`` (zlib's, unsigned)               librdkafka's default
                                                                     ``consistent_random``
=============  ===================================================  ==========================

(murmur2 is Kafka's own variant, seed 0x9747b28c, as kafka-python ships it.)

Keyless messages stick to one partition per topic until a batch of them is
handed to the sender, then move to another chosen at random: batches stay
full while load still spreads evenly over time (whatever the key hash).
"""

from __future__ import annotations

import itertools
import random
import zlib
from typing import Callable, Sequence

from crc32c import crc32c
from kafka.partitioner.default import murmur2

from raylog.errors import ConfigError
from raylog.storage import message as _message
from raylog.storage.stable_hash import stable_bucket


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``: stable everywhere
    (:func:`raylog.storage.stable_hash.stable_bucket`)."""
    return stable_bucket(key, partitions)


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's Java client's partition of ``key``: ``(murmur2(key) & 0x7fffffff) mod partitions``."""
    if partitions <= 0:
        raise ConfigError(f"a topic has at least one partition, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's default partition of ``key``: ``crc32(key) mod partitions`` (zlib's CRC-32)."""
    if partitions <= 0:
        raise ConfigError(f"a topic has at least one partition, got {partitions}")
    return zlib.crc32(key) % partitions


#: the key hashes a producer can use, by name (the module docstring's table)
PARTITIONERS: dict[str, Callable[[bytes, int], int]] = {
    "crc32c": partition_for_key,
    "murmur2": murmur2_partition,
    "crc32": crc32_partition,
}

#: the default key hash
DEFAULT_PARTITIONER = "crc32c"


def key_partitioner(name: str) -> Callable[[bytes, int], int]:
    """The key hash called ``name``; ConfigError naming the choices for any other."""
    try:
        return PARTITIONERS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"partitioner must be one of {', '.join(repr(n) for n in PARTITIONERS)} (crc32c: raylog's; "
            f"murmur2: Kafka's Java client; crc32: librdkafka's default), got {name!r}"
        ) from None


def group_by_partition(
    values: Sequence[bytes], keys: Sequence[bytes | None], partitions: int, check=None, key_partition=None
) -> list[tuple]:
    """``values`` and ``keys`` split by partition (keyless messages under -1).

    One tuple per partition met, by increasing partition: ``(partition,
    positions, values, keys, total, largest)``, where ``positions`` are the
    places in the call (increasing) and ``total`` / ``largest`` the sum and
    the maximum of ``len(key) + len(value)`` over the group. The compiled
    ``_speedups.group`` when built (the same result); this code otherwise,
    after ``check(values, keys)`` when given (the compiled one takes only
    bytes values and keys that are bytes or None, and says None otherwise).
    ``key_partition``: another key hash than crc32c (one of
    :data:`PARTITIONERS`; this code then, never the compiled one).
    """
    fast = _message._speedups
    if key_partition is partition_for_key:
        key_partition = None
    if fast is not None and type(partitions) is int and key_partition is None:
        groups = fast.group(values, keys, partitions)
        if groups is not None:
            return groups
    if check is not None:
        check(values, keys)
    if partitions <= 0:
        raise ConfigError(f"a topic has at least one partition, got {partitions}")
    if key_partition is None:
        parts = [crc32c(k) % partitions if k is not None else -1 for k in keys]
    else:
        parts = [key_partition(k, partitions) if k is not None else -1 for k in keys]
    groups = []
    for p, group in itertools.groupby(sorted(range(len(parts)), key=parts.__getitem__), parts.__getitem__):
        positions = list(group)
        vs = [values[i] for i in positions]
        ks = [keys[i] for i in positions]
        lengths = [len(v) + (len(k) if k is not None else 0) for v, k in zip(vs, ks)]
        groups.append((p, positions, vs, ks, sum(lengths), max(lengths)))
    return groups


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
