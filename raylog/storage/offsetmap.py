"""The cleaner's map of keys to their latest offset, bounded in memory (as
Kafka's ``SkimpyOffsetMap`` under ``log.cleaner.dedupe.buffer.size``).

A key longer than 15 bytes is not stored: its 16-byte BLAKE2b digest is (two
keys that share a digest are, at 2**-128 a pair, taken for one, as in Kafka,
which uses MD5); a shorter key is its own name (it never equals a digest,
and costs no more room).
The map holds at most ``capacity`` entries, ``buffer_bytes`` divided by
:data:`ENTRY_BYTES` (a digest and an i64 offset, Kafka's count) times
:data:`LOAD_FACTOR`; :meth:`OffsetMap.put` of a new key into a full map
returns False and the cleaner stops its dirty section there: it cleans up to
the last offset the map took, and the rest waits for the next pass (Kafka's
fall-back when a segment has more keys than fit).

Two implementations with one interface: :class:`OffsetMap` (a dict of
names, the reference) and, when the compiled module is built,
``raylog.storage._compaction.SlotMap`` (the same names, capacity and
answers, in a table of fixed 24-byte slots as Kafka's: the walks of the
compiled cleaner use it without the interpreter). :func:`new_map` gives the
second when it is there.

Thread-safety: none; one map belongs to one cleaning pass on one thread.
"""

from __future__ import annotations

import os
from hashlib import blake2b
from itertools import repeat

if os.environ.get("RAYLOG_PURE_PYTHON", "") in ("", "0"):
    try:
        from raylog.storage import _compaction
    except ImportError:  # not built: the dict map below does the work
        _compaction = None
else:
    _compaction = None

#: bytes a key takes in the map, as Kafka counts them: its 16-byte digest and an 8-byte offset
ENTRY_BYTES = 24
#: the share of the buffer filled before the map counts as full (Kafka's
#: ``log.cleaner.io.buffer.load.factor``)
LOAD_FACTOR = 0.9
#: the buffer of one cleaner (Kafka's default ``log.cleaner.dedupe.buffer.size``, 128 MiB)
DEFAULT_BUFFER_BYTES = 128 << 20
DIGEST_BYTES = 16


def digest(key: bytes) -> bytes:
    """The map's name for ``key``."""
    return key if len(key) < DIGEST_BYTES else blake2b(key, digest_size=DIGEST_BYTES).digest()


def _names(keys) -> list[bytes]:
    if not keys or max(map(len, keys)) < DIGEST_BYTES:
        return keys
    return [k if len(k) < DIGEST_BYTES else blake2b(k, digest_size=DIGEST_BYTES).digest() for k in keys]


class OffsetMap:
    """``digest(key) -> latest offset`` for at most :attr:`capacity` keys."""

    __slots__ = ("capacity", "_map", "latest_offset")

    def __init__(self, buffer_bytes: int = DEFAULT_BUFFER_BYTES):
        if buffer_bytes < ENTRY_BYTES:
            raise ValueError(f"an offset map of {buffer_bytes} bytes holds no key; give it at least {ENTRY_BYTES}")
        #: the most keys the map takes
        self.capacity = max(1, int(buffer_bytes // ENTRY_BYTES * LOAD_FACTOR))
        self._map: dict[bytes, int] = {}
        #: the largest offset put (-1: none)
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._map)

    @property
    def full(self) -> bool:
        return len(self._map) >= self.capacity

    def put(self, key: bytes, offset: int) -> bool:
        """Remember ``offset`` as the latest of ``key`` (offsets are put in
        growing order); False, remembering nothing, when ``key`` is new and
        the map is full."""
        name = digest(key)
        stored = self._map
        if name not in stored and len(stored) >= self.capacity:
            return False
        stored[name] = offset
        if offset > self.latest_offset:
            self.latest_offset = offset
        return True

    def put_many(self, keys, first_offset: int) -> int:
        """:meth:`put` of ``keys[i]`` at ``first_offset + i`` for each ``i``
        in order, stopping at the first new key a full map refuses; how many
        were put."""
        names = _names(keys)
        stored = self._map
        if len(stored) + len(names) <= self.capacity:
            stored.update(zip(names, range(first_offset, first_offset + len(names))))
            if names and first_offset + len(names) - 1 > self.latest_offset:
                self.latest_offset = first_offset + len(names) - 1
            return len(names)
        for i, name in enumerate(names):
            if name not in stored and len(stored) >= self.capacity:
                return i
            stored[name] = first_offset + i
            if first_offset + i > self.latest_offset:
                self.latest_offset = first_offset + i
        return len(names)

    def get_many(self, keys) -> list[int]:
        """:meth:`get` of each of ``keys``."""
        return list(map(self._map.get, _names(keys), repeat(-1)))

    def get(self, key: bytes) -> int:
        """The latest offset of ``key``, -1 when the map does not hold it."""
        return self._map.get(digest(key), -1)

    def clear(self) -> None:
        self._map.clear()
        self.latest_offset = -1


def new_map(buffer_bytes: int = DEFAULT_BUFFER_BYTES):
    """An empty map of at most ``buffer_bytes``: the compiled ``SlotMap``
    (seeded at random, so that no producer can pick keys that crowd one run
    of slots) when it is built, else an :class:`OffsetMap`."""
    if _compaction is None:
        return OffsetMap(buffer_bytes)
    return _compaction.SlotMap(buffer_bytes, int.from_bytes(os.urandom(8), "little"))
