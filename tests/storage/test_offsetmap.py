"""The cleaner's offset map (raylog.storage.offsetmap): the latest offset of
each key, at most its capacity of keys (Kafka's dedupe buffer arithmetic)."""

from __future__ import annotations

import pytest

from raylog.storage.offsetmap import ENTRY_BYTES, LOAD_FACTOR, OffsetMap


def test_latest_offset_per_key():
    m = OffsetMap(ENTRY_BYTES * 100)
    for offset, key in enumerate([b"a", b"b", b"a", b"", b"b", b"a"]):
        assert m.put(key, offset * 10)
    assert (m.get(b"a"), m.get(b"b"), m.get(b""), m.get(b"c")) == (50, 40, 30, -1)
    assert len(m) == 3 and m.latest_offset == 50


def test_a_full_map_refuses_new_keys_but_updates_known_ones():
    m = OffsetMap(ENTRY_BYTES * 10)
    assert m.capacity == int(10 * LOAD_FACTOR) == 9
    for i in range(9):
        assert m.put(b"k%d" % i, i)
    assert m.full
    assert not m.put(b"new", 100)  # nothing remembered
    assert m.get(b"new") == -1 and m.latest_offset == 8
    assert m.put(b"k3", 101) and m.get(b"k3") == 101
    m.clear()
    assert len(m) == 0 and m.put(b"new", 1)


def test_a_buffer_too_small_for_one_key_is_refused():
    with pytest.raises(ValueError):
        OffsetMap(ENTRY_BYTES - 1)


def test_many_at_once_is_put_one_by_one():
    m = OffsetMap(ENTRY_BYTES * 5)  # 4 keys
    assert m.put_many([b"a", b"b", b"a"], 10) == 3
    assert m.get_many([b"a", b"b", b"c"]) == [12, 11, -1]
    long_key = b"x" * 40
    assert m.put_many([b"c", long_key, b"d", b"b"], 20) == 2  # "d" is the fifth key: refused, and what follows
    assert m.get_many([b"c", long_key, b"d", b"b"]) == [20, 21, -1, 11] and m.latest_offset == 21
    assert m.get(long_key) == 21 and m.get(b"y" * 40) == -1
