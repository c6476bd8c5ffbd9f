"""Kafka record batches checked and stored as they came, stored batches cut
for a Fetch, and format 1's messages converted (pure: no cluster)."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raylog.kafka import records as records_module
from raylog.kafka.records import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    MESSAGE_TOO_LARGE,
    UNSUPPORTED_COMPRESSION_TYPE,
    RecordsRefused,
    encode_batch,
    stored_batches,
    to_stored,
)
from raylog.storage import record_batch
from raylog.storage.decoding import decode_messages
from raylog.storage.markers import encode_marker
from raylog.storage.message import encode_message_set


@pytest.fixture(autouse=True, params=["c", "python"])
def impl(request, monkeypatch):
    """Every test runs with the compiled loops and with the reference."""
    from raylog.kafka import _kafkarecords

    monkeypatch.setattr(records_module, "_kafkarecords", _kafkarecords if request.param == "c" else None)
    monkeypatch.setattr(record_batch, "_speedups", record_batch._speedups if request.param == "c" else None)
    return request.param


def _batch(records, codec: int = 0, headers=(), producer=(-1, -1, -1)) -> bytes:
    if codec == 2:  # kafka-python here has no snappy: raylog's encoder writes what librdkafka sends
        return record_batch.encode_batch([v for _, _, v in records], [k for _, k, _ in records],
                                         [list(headers)] * len(records), [ts for ts, _, _ in records], "snappy")
    builder = DefaultRecordBatchBuilder(2, codec, False, *producer, 1 << 20)
    for i, (ts, key, value) in enumerate(records):
        builder.append(i, ts, key, value, list(headers))
    return bytes(builder.build())


def _stored_records(data, at: int = 777) -> list:
    """The records of ``data`` (batches to store) read back as stored at ``at``."""
    out, pos = [], 0
    while pos < len(data):
        header = record_batch.check_frame(data, pos)
        stamped = record_batch.stamp(bytes(data[pos:pos + header.size]), at + pos)
        out += record_batch.decode_batch(stamped).records
        pos += header.size
    return out


RECORDS = [(1_000 + i, None if i % 2 else f"k{i}".encode(), f"value {i} ".encode() * 20) for i in range(10)]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_a_batch_is_stored_as_it_came_and_its_records_are_base_plus_index(codec):
    data = _batch(RECORDS, codec)
    stored, count = to_stored(data)
    assert count == len(RECORDS) and stored == data  # byte for byte
    got = _stored_records(stored)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == [
        (777 + i, ts, k, v) for i, (ts, k, v) in enumerate(RECORDS)]


def test_headers_null_and_empty_values_are_kept():
    headers = [("h", b"v"), ("h", None), ("empty", b"")]
    records = [(1, b"k", None), (2, None, b""), (3, b"k3", b"v")]
    stored, count = to_stored(_batch(records, headers=headers))
    got = _stored_records(stored)
    assert count == 3 and [(r.key, r.value) for r in got] == [(b"k", None), (None, b""), (b"k3", b"v")]
    assert all(r.headers == headers for r in got)


def test_two_batches_in_one_request_and_a_single_record():
    data = _batch(RECORDS[:3]) + _batch(RECORDS[3:4])
    stored, count = to_stored(data)
    assert count == 4 and stored == data
    assert [r.value for r in _stored_records(stored)] == [v for _, _, v in RECORDS[:4]]


def test_a_compressed_batch_shorter_than_its_count_is_stored_uncompressed():
    records = [(1_000, None, b"")] * 5000  # tiny records that compress far below one byte each
    data = _batch(records, 4)
    assert len(data) < len(records)
    stored, count = to_stored(data)
    header = record_batch.read_header(stored)
    assert count == 5000 and header.codec == 0 and header.size >= header.count
    assert [r.value for r in _stored_records(stored)] == [b""] * 5000
    with pytest.raises(RecordsRefused) as refused:  # uncompressed it would pass max_message_bytes
        to_stored(data, max_message_bytes=len(data) + 100)
    assert refused.value.code == MESSAGE_TOO_LARGE and "uncompressed" in refused.value.message


def test_bad_codec_corruption_old_magic_and_transactions_are_refused():
    from crc32c import crc32c

    odd = bytearray(_batch(RECORDS[:2]))
    struct.pack_into(">h", odd, 21, 5)  # attributes: codec 5 (the CRC made right)
    struct.pack_into(">I", odd, 17, crc32c(bytes(odd[21:])))
    with pytest.raises(RecordsRefused) as err:
        to_stored(bytes(odd))
    assert err.value.code == UNSUPPORTED_COMPRESSION_TYPE
    flipped = bytearray(_batch(RECORDS[:2]))
    flipped[-1] ^= 0xFF
    with pytest.raises(RecordsRefused) as err:
        to_stored(bytes(flipped))
    assert err.value.code == CORRUPT_MESSAGE
    old = bytearray(_batch(RECORDS[:2]))
    old[16] = 1
    with pytest.raises(RecordsRefused) as err:
        to_stored(bytes(old))
    assert err.value.code == INVALID_RECORD
    with pytest.raises(RecordsRefused) as err:
        to_stored(_batch(RECORDS[:2])[:-5])
    assert err.value.code == CORRUPT_MESSAGE
    # a control batch (a transaction's marker) is the coordinator's to write, never a client's
    with pytest.raises(RecordsRefused) as err:
        to_stored(encode_marker(5, 0, True, 0, 1))
    assert err.value.code == INVALID_RECORD and "control batches" in err.value.message


@pytest.mark.parametrize("codec", [0, 1, 4], ids=["none", "gzip", "zstd"])
def test_a_max_timestamp_below_the_records_is_set_as_a_broker_sets_it(codec):
    """sarama before 1.26 sends maxTimestamp -1: the batch is stored with
    its records' largest timestamp and a CRC made again (Kafka's broker does
    the same); a batch damaged otherwise as well is still refused, and a
    partition's own check refuses the unmended batch."""
    from crc32c import crc32c

    from raylog.errors import InvalidMessageError

    good = _batch(RECORDS, codec)
    odd = bytearray(good)
    struct.pack_into(">q", odd, 35, -1)  # maxTimestamp -1, as sarama 1.22 writes it (the CRC made right)
    struct.pack_into(">I", odd, 17, crc32c(bytes(odd[21:])))
    with pytest.raises(InvalidMessageError):
        record_batch.validate_batch(bytes(odd))
    two = _batch(RECORDS[:2])
    stored, count = to_stored(two + bytes(odd) + two)
    assert count == len(RECORDS) + 4
    header = record_batch.read_header(stored, len(two))
    assert header.max_timestamp == max(ts for ts, _, _ in RECORDS)
    assert stored == two + good + two  # the batch the producer should have sent, byte for byte
    assert [r.value for r in _stored_records(stored)] == [v for _, _, v in RECORDS[:2] + RECORDS + RECORDS[:2]]
    also = bytearray(odd)
    also[-1] ^= 0xFF  # damaged inside: its CRC fails, nothing is mended
    with pytest.raises(RecordsRefused) as err:
        to_stored(bytes(also))
    assert err.value.code == CORRUPT_MESSAGE


def test_a_transactional_batch_is_stored_as_it_came():
    builder = DefaultRecordBatchBuilder(2, 0, True, 5, 0, 0, 1 << 20)
    builder.append(0, 1, None, b"v", [])
    batch = bytes(builder.build())
    stored, count = to_stored(batch)
    assert (stored, count) == (batch, 1)
    assert record_batch.decode_batch(stored, 0).header.transactional


def _stored_log(batches) -> bytes:
    """Batches stamped back to back as a partition stores them from offset 0."""
    out = bytearray()
    for batch in batches:
        out += record_batch.stamp(batch, len(out))
    return bytes(out)


def test_stored_batches_are_cut_at_whole_batches_and_a_batch_below_the_offset_is_passed_over():
    batches = [_batch(RECORDS[:3]), _batch(RECORDS[3:4]), _batch(RECORDS[4:9])]
    log = _stored_log(batches)
    sizes = [len(b) for b in batches]
    whole, next_offset, walked = stored_batches(log, 0, 1 << 20)
    assert bytes(whole) == log and next_offset == len(log) == walked
    first, next_offset, _ = stored_batches(log, 0, sizes[0] + sizes[1] - 1)
    assert bytes(first) == log[:sizes[0]] and next_offset == sizes[0]
    tiny, next_offset, _ = stored_batches(log, 0, 1)  # the first batch whole even when larger
    assert bytes(tiny) == log[:sizes[0]] and next_offset == sizes[0]
    inside, _, _ = stored_batches(log, 1, 1 << 20)  # records 1 and 2 of the first batch are at or after 1
    assert bytes(inside) == log
    # an offset past the first batch's last record (2) but inside its bytes: the next batch on
    after, next_offset, walked = stored_batches(log, 3, 1 << 20)
    assert bytes(after) == log[sizes[0]:] and next_offset == len(log)
    only, next_offset, walked = stored_batches(log[:sizes[0]], 3, 1 << 20)
    assert bytes(only) == b"" and next_offset == sizes[0] == walked
    cut, next_offset, walked = stored_batches(log[:-1], 0, 1 << 20)  # a cut last batch waits
    assert bytes(cut) == log[:sizes[0] + sizes[1]] and next_offset == sizes[0] + sizes[1]
    for batch in DefaultRecordBatch(bytes(log[sizes[0]:sizes[0] + sizes[1]])), :
        assert batch.validate_crc() and batch.next_offset == sizes[0] + sizes[1]


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
        want = records
        stored, count = to_stored(data)
        got = _stored_records(stored)
        assert count == len(records) and [(r.timestamp, r.key, r.value) for r in got] == want


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
            stored, count = to_stored(bytes(bad))
        except RecordsRefused as err:
            assert err.code in (CORRUPT_MESSAGE, INVALID_RECORD)
            continue
        assert count == len(RECORDS) == len(_stored_records(stored))


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_batch_that_inflates_past_the_bound_is_refused_as_message_too_large(codec):
    value = bytes(4 << 20)
    bomb = _batch([(1_000, None, value)], codec)
    assert len(bomb) < len(value) // 20
    with pytest.raises(RecordsRefused) as refused:
        to_stored(bomb, 1 << 20, 1 << 20)
    assert refused.value.code == MESSAGE_TOO_LARGE
    # within the bound the same batch is taken as it came
    stored, count = to_stored(bomb, 1 << 20, 8 << 20)
    assert count == 1 and stored == bomb


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_section_that_is_not_its_codec_is_corrupt(codec):
    from crc32c import crc32c

    good = bytearray(_batch(RECORDS, codec))
    good[61:] = b"\x00" * (len(good) - 61)  # the records section: zeros, not a stream of the codec
    struct.pack_into(">I", good, 17, crc32c(memoryview(good)[21:]))
    with pytest.raises(RecordsRefused) as refused:
        to_stored(bytes(good))
    assert refused.value.code == CORRUPT_MESSAGE
