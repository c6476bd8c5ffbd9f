"""The offset index of a cleaned segment (raylog.storage.offsetindex): its
file round-trips, a torn or damaged one is refused (and rebuilt from the
segment's batch headers), and lookups land on the kept batch holding an
offset or, for a removed offset, on the next kept batch (readers see gaps)."""

from __future__ import annotations

import os

import pytest

from raylog.storage.offsetindex import (
    OffsetIndex,
    OffsetIndexError,
    index_name,
    scan_entries,
)
from raylog.storage.record_batch import encode_batch, stamp

BASE = 1000


def _cleaned_segment():
    """Three kept batches of a segment at BASE whose batches at 1000+0.. were
    partly removed: (segment bytes, entries)."""
    kept = []
    data = b""
    for offset in (BASE + 70, BASE + 300, BASE + 900):
        batch = stamp(encode_batch([b"v"], keys=[b"k%d" % offset]), offset)
        span = int.from_bytes(batch[23:27], "big") + 1
        kept.append((offset, span, len(data)))
        data += batch
    return data, kept


def test_round_trip_and_lookups(tmp_path):
    data, entries = _cleaned_segment()
    end = BASE + 2000
    index = OffsetIndex(BASE, end, entries, len(data))
    path = tmp_path / index_name(BASE)
    index.write(str(path))
    again = OffsetIndex.load(str(tmp_path), BASE, len(data))
    assert again.entries() == index.entries() and again.end_offset == end and len(again) == 3
    first, second, third = again.entries()
    assert again.locate(BASE) == first  # removed: the next kept batch
    assert again.locate(BASE + 70) == first
    assert again.locate(first.next_offset - 1) == first  # inside the batch
    assert again.locate(first.next_offset) == second  # a gap after it
    assert again.locate(BASE + 900) == third
    assert again.locate(third.next_offset) is None
    assert again.position_of(third.next_offset) == len(data)
    assert again.offset_at(second.position) == BASE + 300 and again.offset_at(len(data)) == end
    with pytest.raises(KeyError):
        again.offset_at(1)
    assert [e.offset for e in again.batches_between(BASE + 71, BASE + 901)] == [BASE + 300, BASE + 900]


def test_a_segment_without_an_index_was_never_cleaned(tmp_path):
    assert OffsetIndex.load(str(tmp_path), BASE, 10) is None


@pytest.mark.parametrize("damage", ["torn", "flip", "other base", "empty"])
def test_a_damaged_index_is_refused_and_rebuilt_from_the_segment(tmp_path, damage):
    data, entries = _cleaned_segment()
    index = OffsetIndex(BASE, BASE + 2000, entries, len(data))
    raw = bytearray(index.to_bytes())
    if damage == "torn":
        raw = raw[:-7]
    elif damage == "flip":
        raw[20] ^= 0x40
    elif damage == "empty":
        raw = b""
    elif damage == "other base":  # another segment's index, sound in itself
        raw = OffsetIndex(BASE + 1, BASE + 2000, [], 0).to_bytes()
    path = tmp_path / index_name(BASE)
    path.write_bytes(bytes(raw))
    with pytest.raises(OffsetIndexError):
        OffsetIndex.load(str(tmp_path), BASE, len(data))
    rebuilt = OffsetIndex(BASE, BASE + 2000, scan_entries(lambda p, n: data[p : p + n], len(data)), len(data))
    assert rebuilt.entries() == index.entries()


@pytest.mark.parametrize(
    "entries, size",
    [
        ([(BASE + 10, 5, 0), (BASE + 12, 5, 70)], 140),  # overlapping offsets
        ([(BASE + 10, 5, 70)], 140),  # not starting at position 0
        ([(BASE + 10, 5, 0), (BASE + 20, 5, 0)], 140),  # positions not growing
        ([(BASE - 1, 5, 0)], 70),  # before the base
        ([(BASE + 1990, 50, 0)], 70),  # past the end offset
        ([], 70),  # a file the index does not cover
    ],
)
def test_rules_broken_are_refused(entries, size):
    with pytest.raises(OffsetIndexError):
        OffsetIndex(BASE, BASE + 2000, entries, size)


def test_a_cut_segment_cannot_be_scanned():
    data, _entries = _cleaned_segment()
    with pytest.raises(OffsetIndexError):
        scan_entries(lambda p, n: data[p : p + n], len(data) - 3)
    with pytest.raises(OffsetIndexError):
        scan_entries(lambda p, n: data[p : p + n], len(data) + 30)  # bytes after the last batch
