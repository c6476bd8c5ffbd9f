"""``poll_batch``'s index of record batches (format 2: ``_speedups.batches_index``
in :func:`raylog.consumer.batch.fetched_batch`) hands out exactly what the
decoder hands out: the same messages with the same next offsets, the same
columns and Arrow table; a fetch it does not cover (headers, a codec, a
control batch, damage) goes the decoder's way. Pure logic over encoded
batches (the end-to-end path: tests/consumer/test_batch_format2.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.consumer.batch import MessageBatch, fetched_batch
from raylog.consumer.fetcher import decode_fetched
from raylog.errors import CorruptMessageError
from raylog.storage import message as _format
from raylog.storage.record_batch import encode_batch, stamp

pytestmark = pytest.mark.skipif(not hasattr(_format._speedups, "batches_index"), reason="not built here")

TP = ("t", 3)
blobs = st.one_of(st.none(), st.binary(max_size=40))
batch_st = st.lists(st.tuples(blobs, blobs), min_size=1, max_size=12)


def _log(batches, at: int = 5000, **kw) -> bytes:
    buf = bytearray()
    for records in batches:
        buf += stamp(encode_batch([v for _, v in records], [k for k, _ in records],
                                  timestamp_ms=[100 + i for i in range(len(records))], **kw), at + len(buf))
    return bytes(buf)


def _indexed(batch) -> bool:
    return isinstance(batch, MessageBatch) and batch._nexts is not None and batch._records is None


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(batch_st, min_size=1, max_size=6), cut=st.integers(0, 60))
def test_the_index_gives_what_the_decoder_gives(batches, cut):
    data = _log(batches)
    data = data + _log([[(None, b"tail")]], 5000 + len(data))[:cut]  # a batch cut by the end of the fetch
    indexed, used = fetched_batch(data, 5000, TP, 1 << 20, 1 << 24)
    decoded, used_decoded = decode_fetched(data, 5000, TP, 1 << 20, 1 << 24)
    assert _indexed(indexed) and used == used_decoded == len(data) - cut
    assert [indexed[i] for i in range(len(indexed))] == decoded
    assert [type(m) for m in indexed] == [type(m) for m in decoded]
    assert [m.next_offset for m in indexed] == [m.next_offset for m in decoded]
    assert indexed.next_offset == decoded[-1].next_offset == 5000 + used
    assert list(indexed.offsets) == [m.offset for m in decoded]
    assert [None if v is None else bytes(v) for v in indexed.values] == [m.value for m in decoded]
    assert [None if k is None else bytes(k) for k in indexed.keys] == [m.key for m in decoded]
    assert indexed.headers == [[] for _ in decoded]
    whole = MessageBatch.of_records(decoded, stored=memoryview(data)[:used], stored_at=5000)
    assert indexed.to_arrow().equals(whole.to_arrow())
    k = len(decoded) // 2
    assert indexed.cut_before(k) == whole.cut_before(k)  # parts start at a batch: they keep stored bytes
    assert bytes(indexed.stored_bytes()) == data[:used]


def test_a_part_of_the_index_is_a_batch_of_messages_and_its_records_are_built_once():
    data = _log([[(b"k", b"a"), (None, None)], [(None, b"b")], [(b"", b""), (None, b"c")]])
    batch, _ = fetched_batch(data, 5000, TP, 1 << 20, 1 << 24)
    assert _indexed(batch) and not batch.indexed  # offsets are not byte positions: not format 1's index
    assert batch.cut_before(1) == 0 and batch.cut_before(3) == 3
    first = batch[1].next_offset - 5000  # the first batch's size: its last record resumes at the next batch
    assert batch[0].next_offset == 5001 and batch[1].value is None and batch[1].key is None
    part = batch[2:5]  # the second and third batches, whole: they keep their stored bytes
    assert [m.value for m in part] == [b"b", b"", b"c"] and bytes(part.stored_bytes()) == data[first:]
    assert batch.records is batch.records and [m.value for m in batch.records] == [b"a", None, b"b", b"", b"c"]
    assert batch[-1].next_offset == 5000 + len(data)


@pytest.mark.parametrize("kind", ["headers", "gzip", "damaged"])
def test_what_the_index_does_not_cover_goes_the_decoders_way(kind):
    if kind == "headers":
        data = _log([[(None, b"a")]])
        data += stamp(encode_batch([b"h"], headers=[[("x", b"1")]]), 5000 + len(data))
    elif kind == "gzip":
        data = _log([[(None, b"a")] * 5], compression="gzip")
    else:
        data = bytearray(_log([[(None, b"abcdef")]]))
        data[70] ^= 1
        data = bytes(data)
    if kind == "damaged":
        with pytest.raises(CorruptMessageError):
            fetched_batch(data, 5000, TP, 1 << 20, 1 << 24)
        return
    batch, used = fetched_batch(data, 5000, TP, 1 << 20, 1 << 24)
    assert not _indexed(batch) and used == len(data)
    assert list(batch) == decode_fetched(data, 5000, TP, 1 << 20, 1 << 24)[0]
