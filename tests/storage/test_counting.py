"""Counting messages without reading them out (raylog.storage.counting):
the count equals what decode_messages returns, every CRC is checked, and a
damaged byte is an error, never a wrong count. Runs against the compiled
walker and the Python reference (conftest)."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import CorruptMessageError, InvalidMessageError, InvalidOffsetError, OffsetOutOfRangeError
from raylog.storage.compression import CODEC_ZSTD, compress
from raylog.storage.counting import count_message_set, count_range, count_records
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.memory import MemoryLog
from raylog.storage.message import encode_message, encode_message_set

from tests.storage.conftest import COMPRESSIONS


def mixed_sets() -> list[bytes]:
    """Plain, keyed and compressed sets (every codec) back to back."""
    sets = []
    for i, codec in enumerate(COMPRESSIONS * 2):
        values = [b"v%d-%d" % (i, j) * (j % 5 + 1) for j in range(7 + i)]
        keys = [b"k%d" % j if j % 2 else None for j in range(len(values))]
        sets.append(encode_message_set(values, keys, 1_700_000_000_000 + i, compression=codec))
    return sets


def decoded(buf: bytes) -> int:
    records, consumed = decode_messages(buf, 0, partial_tail_ok=False)
    assert consumed == len(buf)
    return len(records)


def test_count_equals_what_a_full_decode_returns_with_every_codec():
    data = b"".join(mixed_sets())
    valid, messages, err = count_message_set(data, 1 << 20)
    assert err is None and valid == len(data)
    assert messages == decoded(data)
    assert messages > len(mixed_sets())  # wrappers counted by their inner messages


def test_a_flipped_byte_in_a_plain_value_is_a_corrupt_message_not_a_count():
    data = bytearray(encode_message_set([b"a" * 50, b"b" * 50, b"c" * 50]))
    second = 4 + int.from_bytes(data[:4], "big")
    data[second + 40] ^= 0x10
    valid, messages, err = count_message_set(bytes(data), 1 << 20)
    assert (valid, messages) == (second, 1)
    assert isinstance(err, CorruptMessageError) and err.offset == second


def test_a_flipped_byte_in_a_compressed_wrapper_is_a_corrupt_message():
    plain = encode_message_set([b"x" * 30])
    wrapper = bytearray(encode_message_set([b"y%d" % i for i in range(20)], compression="gzip"))
    wrapper[30] ^= 0x01
    _valid, messages, err = count_message_set(plain + bytes(wrapper), 1 << 20)
    assert messages == 1
    assert isinstance(err, CorruptMessageError) and err.offset == len(plain)


def test_a_damaged_inner_message_under_a_good_wrapper_crc_is_caught():
    inner = bytearray(encode_message_set([b"inner-%d" % i for i in range(5)], timestamp_ms=1))
    inner[25] ^= 0x04  # the first inner message's value; the wrapper's CRC is made over the damage
    wrapper = encode_message(compress(CODEC_ZSTD, bytes(inner)), None, 1, CODEC_ZSTD)
    valid, messages, err = count_message_set(wrapper, 1 << 20, base_offset=100)
    assert (valid, messages) == (0, 0)
    assert isinstance(err, CorruptMessageError) and err.offset == 100


def test_a_cut_last_message_is_partial():
    data = encode_message_set([b"a" * 10, b"b" * 10])
    valid, messages, err = count_message_set(data[:-3], 1 << 20)
    assert messages == 1 and valid == len(data) // 2
    assert isinstance(err, InvalidMessageError) and err.details.get("partial")


@pytest.fixture(params=["file", "memory"])
def make_log(request, tmp_path):
    logs = []

    def make(**config):
        settings = TopicConfig(flush_messages=10**9, flush_ms=10**9, **config)
        log = PartitionLog(tmp_path / "t-0", settings) if request.param == "file" else MemoryLog(settings)
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()


def test_count_range_over_segments_in_bounded_steps_equals_the_decode(make_log):
    log = make_log(segment_bytes=4096, max_message_bytes=2048)
    sets = mixed_sets() * 6
    for s in sets:
        log.append(s)
    log.flush()
    end = log.high_watermark
    total = decoded(b"".join(sets))
    assert count_range(log, 0, end, 1 << 30) == (total, end)
    # bounded: at most about max_bytes per call, resumed at the boundary given
    pos = counted = calls = 0
    while pos < end:
        messages, nxt = count_range(log, pos, end, 1000)
        assert nxt > pos
        pos, counted, calls = nxt, counted + messages, calls + 1
    assert (counted, pos) == (total, end) and calls > 3
    # a sub-range between set boundaries
    first = len(sets[0])
    assert count_range(log, first, first + len(sets[1]), 1 << 30) == (decoded(sets[1]), first + len(sets[1]))
    assert count_range(log, first, first, 1 << 30) == (0, first)


def test_count_range_refuses_offsets_outside_the_log_or_off_a_boundary(make_log):
    log = make_log()
    log.append(encode_message_set([b"a" * 20, b"b" * 20]))
    log.flush()
    hw = log.high_watermark
    with pytest.raises(OffsetOutOfRangeError):
        count_range(log, 0, hw + 1, 1 << 20)
    with pytest.raises(OffsetOutOfRangeError):
        count_range(log, hw, 0, 1 << 20)
    with pytest.raises(InvalidOffsetError):
        count_range(log, 3, hw, 1 << 20)
    with pytest.raises(InvalidOffsetError) as info:
        count_range(log, 0, hw - 5, 1 << 20)
    assert info.value.offset == hw - 5


def test_count_records_stops_after_n_messages_at_the_next_record_offset_even_inside_a_wrapper(make_log):
    """COUNT version 1: from any record offset (inside a wrapper too), at most
    n messages; the offset reached is the record offset of the next message."""
    log = make_log(segment_bytes=4096, max_message_bytes=2048)
    sets = mixed_sets() * 3
    for s in sets:
        log.append(s)
    log.flush()
    end = log.high_watermark
    records, _ = decode_messages(b"".join(sets), 0, partial_tail_ok=False)
    offsets = [r[0] for r in records]  # record offsets: wrapper offset + i inside wrappers
    assert len(set(offsets)) == len(offsets)
    total = len(offsets)
    assert count_records(log, 0, end, 1 << 30, -1) == (total, end)
    for a in (0, 1, 5, 9, 20, total - 3):
        for n in (0, 1, 2, 3, 7, 13, 50, total):
            want = min(n, total - a)
            nxt = offsets[a + want] if a + want < total else end
            assert count_records(log, offsets[a], end, 1 << 30, n) == (want, nxt), (a, n)
    # walking by n from the start meets every record once, whatever the byte bound
    pos, seen = 0, 0
    while pos < end:
        messages, pos = count_records(log, pos, end, 700, 4)
        assert 0 < messages <= 4
        seen += messages
        assert pos == (offsets[seen] if seen < total else end)
    assert seen == total
    with pytest.raises(OffsetOutOfRangeError):
        count_records(log, 0, end + 1, 1 << 20, 5)
    with pytest.raises(InvalidOffsetError):
        count_records(log, 3, end, 1 << 20, 5)  # inside a plain message: not a record offset


def _mixed_batches(draw_kinds):
    """Record batches back to back: plain ones of 1..3 records, gzip ones and
    control ones (markers: no records for a reader), as ``draw_kinds`` says."""
    from raylog.storage.record_batch import encode_batch

    parts = []
    for i, kind in enumerate(draw_kinds):
        values = [b"v%d-%d" % (i, j) for j in range(1 + i % 3)]
        if kind == "plain":
            parts.append(encode_batch(values, producer_id=3, producer_epoch=0, base_sequence=i))
        elif kind == "gzip":
            parts.append(encode_batch(values, compression="gzip"))
        else:
            parts.append(encode_batch([b"\x00\x00\x00\x00"], control=True))
    return b"".join(parts)


@pytest.mark.parametrize("damage", [None, "crc", "cut"])
def test_the_compiled_count_of_record_batches_agrees_with_the_reference(monkeypatch, damage):
    """COUNT walks runs of plain record batches in one compiled pass; its
    answer (bytes, records, error) is the reference's, batch for batch, over
    plain, compressed and control batches and a damaged or cut one."""
    from hypothesis import given, settings, strategies as st

    from raylog.storage import record_batch

    compiled = record_batch._speedups
    assert compiled is not None and hasattr(compiled, "batches_count")

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.sampled_from(["plain", "plain", "gzip", "control"]), min_size=1, max_size=12), st.data())
    def check(kinds, data):
        buf = bytearray(_mixed_batches(kinds))
        if damage == "crc":
            buf[data.draw(st.integers(30, len(buf) - 1))] ^= 0x40
        elif damage == "cut":
            del buf[data.draw(st.integers(1, len(buf) - 1)):]
        buf = bytes(buf)
        monkeypatch.setattr(record_batch, "_speedups", compiled)
        fast = count_message_set(buf, 1 << 20)
        monkeypatch.setattr(record_batch, "_speedups", None)
        reference = count_message_set(buf, 1 << 20)
        assert fast[:2] == reference[:2]
        assert type(fast[2]) is type(reference[2])
        assert str(fast[2]) == str(reference[2])

    check()
