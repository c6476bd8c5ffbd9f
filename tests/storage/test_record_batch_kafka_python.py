"""Format 2 checked against an independent implementation of RecordBatch v2:
kafka-python's ``DefaultRecordBatch`` (reader) and ``DefaultRecordBatchBuilder``
(writer). Its batches carry Kafka's lastOffsetDelta (count - 1), raylog's carry
12 + batchLength - 1; record ``i`` is at baseOffset + i in both."""

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raylog.storage.record_batch import decode_batch, encode_batch, read_header, stamp, validate_batch

BOTH_IMPLEMENTATIONS = True  # see tests/storage/conftest.py


#: every test here runs against the compiled fast path and the Python reference
pytestmark = pytest.mark.usefixtures("batch_implementation")

# kafka-python reads snappy only through python-snappy, which is not installed:
# snappy is checked against raw/xerial snappy in test_record_batch.py instead.
KAFKA_PYTHON_CODECS = {None: 0, "gzip": 1, "lz4": 3, "zstd": 4}


def _records(n):
    return [
        (
            None if i % 3 == 0 else b"k%d" % i,
            None if i % 5 == 4 else b"value-%d" % i * (i % 7),
            [("h", b"%d" % i), ("h", None)] if i % 2 else [],
            1_700_000_000_000 + (i * 37) % 11,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("compression", list(KAFKA_PYTHON_CODECS))
def test_kafka_python_reads_raylog_batches(compression):
    records = _records(30)
    batch = encode_batch(
        [r[1] for r in records],
        [r[0] for r in records],
        [r[2] for r in records],
        [r[3] for r in records],
        compression,
        producer_id=11,
        producer_epoch=2,
        base_sequence=100,
    )
    stamped = stamp(batch, 9_000, leader_epoch=4)
    theirs = DefaultRecordBatch(stamped)
    assert theirs.validate_crc()
    assert theirs.base_offset == 9_000
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (11, 2, 100)
    assert theirs.next_offset == 9_000 + len(stamped)  # raylog's rule, read by Kafka's reader
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]
    assert got == [(9_000 + i, ts, k, v, h) for i, (k, v, h, ts) in enumerate(records)]


@pytest.mark.parametrize("compression", list(KAFKA_PYTHON_CODECS))
def test_raylog_reads_kafka_python_batches(compression):
    records = _records(30)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=KAFKA_PYTHON_CODECS[compression],
        is_transactional=0,
        producer_id=11,
        producer_epoch=2,
        base_sequence=100,
        batch_size=1 << 20,
    )
    for i, (key, value, headers, ts) in enumerate(records):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    client = bytes(builder.build())
    header = validate_batch(client)
    assert header.last_offset_delta == 29  # Kafka's count - 1
    stamped = stamp(client, 5_000, leader_epoch=1)
    stamped_header = validate_batch(stamped)  # lastOffsetDelta and crc rewritten, consistent
    assert stamped_header.last_offset_delta == len(client) - 1
    assert stamped_header.next_offset == 5_000 + len(client)
    decoded = decode_batch(stamped)
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded.records]
    assert got == [(5_000 + i, ts, k, v, h) for i, (k, v, h, ts) in enumerate(records)]
    # and kafka-python reads the stamped batch back: its crc is right
    again = DefaultRecordBatch(stamped)
    assert again.validate_crc() and again.next_offset == 5_000 + len(client)
    assert [r.value for r in again] == [r[1] for r in records]


def test_header_fields_match_kafka_python():
    batch = stamp(encode_batch([b"a", b"b", b"c"], timestamp_ms=[5, 9, 7], transactional=True,
                               producer_id=3, producer_epoch=1, base_sequence=0), 64)
    ours = read_header(batch)
    theirs = DefaultRecordBatch(batch)
    assert (ours.base_offset, ours.count, ours.max_timestamp, ours.transactional, ours.crc) == (
        theirs.base_offset, len(list(DefaultRecordBatch(batch))), theirs.max_timestamp,
        theirs.is_transactional, theirs.crc,
    )
