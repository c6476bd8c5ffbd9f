"""The stable hash: bytes -> one of ``n`` buckets, the same in every process.

``stable_bucket(data, n)`` is ``crc32c(data) mod n``. CRC32C (Castagnoli,
the checksum of the message format, :mod:`raylog.storage.message`) is an
unsigned 32-bit value, so the bucket is never negative, and it is the same
on every machine, unlike Python's salted ``hash()``. The producer's
partitioner maps a key to a partition with it
(:func:`raylog.producer.partitioner.partition_for_key`), the placement maps
a topic name to its first disk node (:func:`raylog.actors.placement.place_topic`),
and the supervisor picks a lost replica's new node with it.
"""

from __future__ import annotations

from crc32c import crc32c

from raylog.errors import ConfigError


def stable_bucket(data: bytes, buckets: int) -> int:
    """The bucket of ``data`` among ``buckets``: stable everywhere."""
    if buckets <= 0:
        raise ConfigError(f"a topic has at least one partition, got {buckets}")
    return crc32c(data) % buckets
