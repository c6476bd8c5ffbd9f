"""Kafka record batches to raylog message sets and back (pure: no cluster)."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raylog.kafka import records as records_module
from raylog.kafka.records import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    UNSUPPORTED_COMPRESSION_TYPE,
    RecordsRefused,
    encode_batch,
    to_message_set,
)
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set


@pytest.fixture(autouse=True, params=["c", "python"])
def impl(request, monkeypatch):
    """Every test runs with the compiled record loops and with the reference."""
    from raylog.kafka import _kafkarecords

    monkeypatch.setattr(records_module, "_kafkarecords", _kafkarecords if request.param == "c" else None)
    return request.param


def _batch(records, codec: int = 0, headers=()) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
    for i, (ts, key, value) in enumerate(records):
        builder.append(i, ts, key, value, list(headers))
    return bytes(builder.build())


RECORDS = [(1_000 + i, None if i % 2 else f"k{i}".encode(), f"value {i} ".encode() * 20) for i in range(10)]


@pytest.mark.parametrize("codec", [0, 1, 3, 4])
def test_a_batch_becomes_messages_whose_offsets_are_base_plus_index(codec):
    message_set, count = to_message_set(_batch(RECORDS, codec))
    assert count == len(RECORDS)
    stored_at = 777  # wherever the log puts the set
    decoded, consumed = decode_messages(message_set, stored_at)
    assert consumed == len(message_set)
    # the offset a Kafka producer reports for record i (base + i) is its raylog offset
    assert [(o, ts, k, v) for o, ts, k, v in decoded] == [
        (stored_at + i, ts, k, v) for i, (ts, k, v) in enumerate(RECORDS)]


def test_two_batches_in_one_request_and_a_single_record():
    data = _batch(RECORDS[:3]) + _batch(RECORDS[3:4])
    message_set, count = to_message_set(data)
    decoded, _ = decode_messages(message_set, 0)
    assert count == 4 and [v for _, _, _, v in decoded] == [v for _, _, v in RECORDS[:4]]


def test_headers_snappy_corruption_and_old_magic_are_refused():
    with pytest.raises(RecordsRefused) as err:
        to_message_set(_batch(RECORDS[:2], headers=[("h", b"v")]))
    assert err.value.code == INVALID_RECORD and "headers" in err.value.message
    snappy = bytearray(_batch(RECORDS[:2]))
    struct.pack_into(">h", snappy, 21, 2)  # attributes: snappy (the CRC is checked first: fix it)
    from crc32c import crc32c

    struct.pack_into(">I", snappy, 17, crc32c(bytes(snappy[21:])))
    with pytest.raises(RecordsRefused) as err:
        to_message_set(bytes(snappy))
    assert err.value.code == UNSUPPORTED_COMPRESSION_TYPE
    flipped = bytearray(_batch(RECORDS[:2]))
    flipped[-1] ^= 0xFF
    with pytest.raises(RecordsRefused) as err:
        to_message_set(bytes(flipped))
    assert err.value.code == CORRUPT_MESSAGE
    old = bytearray(_batch(RECORDS[:2]))
    old[16] = 1
    with pytest.raises(RecordsRefused) as err:
        to_message_set(bytes(old))
    assert err.value.code == INVALID_RECORD
    with pytest.raises(RecordsRefused) as err:
        to_message_set(_batch(RECORDS[:2])[:-5])
    assert err.value.code == CORRUPT_MESSAGE


def test_a_fetched_batch_reads_back_and_points_past_the_last_message():
    message_set = encode_message_set([b"a", b"bb", b"ccc"], [None, b"k", None], [5, 6, 4])
    decoded, consumed = decode_messages(message_set, 100)
    batch = DefaultRecordBatch(encode_batch(decoded, 100 + consumed))
    assert batch.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value) for r in batch] == decoded
    # the client continues at the next message's offset, not inside the last one
    assert batch.next_offset == 100 + consumed
    assert batch.base_offset == 100 and batch.max_timestamp == 6


def test_random_records_read_back_through_kafka_python():
    import random

    rng = random.Random(10)
    records, offset = [], 10**9
    for _ in range(300):
        offset += rng.randrange(1, 400)
        key = None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 300))
        records.append((offset, rng.randrange(-2**40, 2**41), key, rng.randbytes(rng.randrange(0, 2000))))
    batch = DefaultRecordBatch(encode_batch(records, offset + 50))
    assert batch.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value) for r in batch] == records
    assert batch.next_offset == offset + 50


def _random_records(rng, n: int, start: int = 10**9) -> list:
    records, offset = [], start
    for _ in range(n):
        offset += rng.randrange(1, 400)
        key = None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 300))
        records.append((offset, rng.randrange(0, 2**41), key, rng.randbytes(rng.randrange(0, 2000))))
    return records


@pytest.mark.parametrize("codec", [0, 1, 3, 4])
def test_random_batches_from_kafka_python_store_what_kafka_python_reads(codec):
    import random

    rng = random.Random(codec)
    for _ in range(20):
        records = [(ts, key, value) for _, ts, key, value in _random_records(rng, rng.randrange(1, 40))]
        data = _batch(records, codec)
        want = [(ts, key, b"" if value is None else value) for ts, key, value in records]
        message_set, count = to_message_set(data)
        decoded, _ = decode_messages(message_set, 0)
        assert count == len(records) and [(ts, k, v) for _, ts, k, v in decoded] == want


def test_damage_inside_the_records_is_refused_as_corrupt_and_nothing_else_is_raised():
    """Bytes of the records section changed (the CRC made right again, as a
    bad client would send them): refused as CORRUPT_MESSAGE or INVALID_RECORD
    (a header count), never another error, never a wrong record count."""
    import random

    from crc32c import crc32c

    rng = random.Random(3)
    good = _batch(RECORDS)
    for _ in range(300):
        bad = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            bad[rng.randrange(61, len(bad))] = rng.randrange(256)
        struct.pack_into(">I", bad, 17, crc32c(bytes(bad[21:])))
        try:
            message_set, count = to_message_set(bytes(bad))
        except RecordsRefused as err:
            assert err.code in (CORRUPT_MESSAGE, INVALID_RECORD)
            continue
        assert count == len(RECORDS) == len(decode_messages(message_set, 0)[0])


@pytest.mark.parametrize("codec", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_a_batch_that_inflates_past_the_bound_is_refused_as_message_too_large(codec):
    from raylog.kafka.records import MESSAGE_TOO_LARGE

    value = bytes(4 << 20)
    bomb = _batch([(1_000, None, value)], codec)
    assert len(bomb) < len(value) // 100
    with pytest.raises(RecordsRefused) as refused:
        to_message_set(bomb, 1 << 20)
    assert refused.value.code == MESSAGE_TOO_LARGE and "more than the limit" in refused.value.message
    # within the bound the same batch is taken
    message_set, count = to_message_set(bomb, 8 << 20)
    assert count == 1 and decode_messages(message_set, 0, max_message_bytes=8 << 20)[0][0][3] == value


@pytest.mark.parametrize("codec", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_a_compressed_section_that_is_not_its_codec_is_corrupt(codec):
    from crc32c import crc32c

    good = bytearray(_batch(RECORDS, codec))
    good[61:] = b"\x00" * (len(good) - 61)  # the records section: zeros, not a stream of the codec
    struct.pack_into(">I", good, 17, crc32c(memoryview(good)[21:]))
    with pytest.raises(RecordsRefused) as refused:
        to_message_set(bytes(good))
    assert refused.value.code == CORRUPT_MESSAGE
