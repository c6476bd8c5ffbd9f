"""Format 2, the record batch (raylog.storage.record_batch): round trips, the
offsets rule, stamping, format detection and the typed errors of bad batches."""

import struct
import zlib

import cramjam
import lz4.frame
import pytest
import zstandard
from crc32c import crc32c

from raylog.errors import (
    ConfigError,
    CorruptMessageError,
    InflatedSizeTooLargeError,
    InvalidMessageError,
    MessageTooLargeError,
)
from raylog.storage import record_batch as rb
from raylog.storage.compression import snappy_compress, snappy_decompress
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import (
    HEADER_SIZE,
    decode_batch,
    encode_batch,
    encode_records,
    format_at,
    iter_batches,
    needs_reencode,
    read_header,
    reencode_uncompressed,
    stamp,
    stamp_into,
    validate_batch,
)

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
# the fixtures of tests/storage/conftest.py switch format 1's code; this module
# runs once (tests/storage/test_record_batch_speedups.py compares C and Python)
BOTH_IMPLEMENTATIONS = True


#: every test here runs against the compiled fast path and the Python reference
pytestmark = pytest.mark.usefixtures("batch_implementation")


def _records():
    return [
        (None, b"v0", [("h", b"1"), ("h", None), ("z", b"")], 1_000),
        (b"", None, None, 1_005),
        (b"k", b"", [], 990),
        (None, None, [("\u00e9t\u00e9", b"\x00\xff")], 1_001),
        (b"key" * 50, b"value" * 400, [("a", b"x")] * 3, 1_002),
    ]


def _reseal(batch: bytes) -> bytes:
    """The batch with its crc recomputed (to reach the checks after the crc)."""
    buf = bytearray(batch)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


def _with_records_section(batch: bytes, section: bytes, count: int | None = None) -> bytes:
    """``batch``'s header over another records section (lengths, count and crc fixed)."""
    head = bytearray(batch[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(section))
    struct.pack_into(">i", head, 23, HEADER_SIZE + len(section) - 1)
    if count is not None:
        struct.pack_into(">i", head, 57, count)
    return _reseal(bytes(head) + section)


# --------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("compression", CODECS)
def test_round_trip_per_codec(compression):
    records = _records()
    batch = encode_records(records, compression, producer_id=42, producer_epoch=3, base_sequence=7)
    header = validate_batch(batch)
    assert header.codec == rb._codec_of(compression)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 7)
    assert header.last_sequence == 7 + len(records) - 1
    assert header.count == len(records)
    assert header.base_timestamp == 1_000 and header.max_timestamp == 1_005
    assert header.base_offset == 0 and header.partition_leader_epoch == -1
    decoded = decode_batch(stamp(batch, 4_096, leader_epoch=9))
    assert not decoded.control
    assert decoded.header.partition_leader_epoch == 9
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded.records] == [
        (4_096 + i, ts, key, value, list(headers or [])) for i, (key, value, headers, ts) in enumerate(records)
    ]


def test_null_and_empty_stay_distinct():
    batch = encode_batch([None, b"", b"x"], [b"", None, None], timestamp_ms=1)
    (a, b, c) = decode_batch(batch).records
    assert (a.key, a.value) == (b"", None)
    assert (b.key, b.value) == (None, b"")
    assert (c.key, c.value) == (None, b"x")


def test_headers_keep_order_duplicates_and_null_values():
    headers = [("b", b"2"), ("a", None), ("b", b"1"), ("a", b""), ("b", b"2")]
    (record,) = decode_batch(encode_batch([b"v"], headers=[headers], timestamp_ms=0)).records
    assert record.headers == headers


def test_offsets_rule_and_next_offset():
    batch = encode_batch([b"x"] * 10, timestamp_ms=0)
    header = read_header(batch)
    assert header.last_offset_delta == 12 + header.batch_length - 1 == len(batch) - 1
    stamped = read_header(stamp(batch, 1_000))
    assert stamped.next_offset == 1_000 + len(batch)
    # raylog's producer's batch: stamping does not touch the crc
    assert stamped.crc == header.crc


def test_decode_from_offset_skips_records_before_it():
    batch = stamp(encode_batch([b"a", b"b", b"c", b"d"], timestamp_ms=0), 200)
    assert [r.value for r in decode_batch(batch, from_offset=202).records] == [b"c", b"d"]
    assert [r.offset for r in decode_batch(batch, from_offset=100).records] == [200, 201, 202, 203]
    assert decode_batch(batch, from_offset=250).records == []


def test_log_append_time_reports_max_timestamp():
    batch = encode_batch([b"a", b"b"], timestamp_ms=[5, 7], log_append_time=True)
    buf = bytearray(batch)
    struct.pack_into(">q", buf, 35, 123_456)  # maxTimestamp: the append time
    decoded = decode_batch(_reseal(bytes(buf)))
    assert [r.timestamp for r in decoded.records] == [123_456, 123_456]


def test_control_and_transactional_flags_are_exposed():
    batch = encode_batch([b"\x00\x00\x00\x01"], [b"\x00\x00\x00\x00"], timestamp_ms=0,
                         producer_id=5, producer_epoch=0, transactional=True, control=True)
    decoded = decode_batch(batch)
    assert decoded.control and decoded.header.transactional
    assert not decode_batch(encode_batch([b"x"], timestamp_ms=0)).control


def test_large_varints_round_trip():
    value = b"v" * 70_000  # a 3-byte length varint
    batch = encode_batch([value], timestamp_ms=[2**40])
    (record,) = decode_batch(batch).records
    assert record.value == value and record.timestamp == 2**40
    deltas = encode_batch([b"a", b"b"], timestamp_ms=[0, 2**50])  # a long timestampDelta varlong
    assert [r.timestamp for r in decode_batch(deltas).records] == [0, 2**50]


def test_encoder_refuses_bad_arguments():
    with pytest.raises(ConfigError, match="at least one record"):
        encode_batch([])
    with pytest.raises(ConfigError, match="keys"):
        encode_batch([b"a"], [None, None])
    with pytest.raises(ConfigError, match="compression"):
        encode_batch([b"a"], compression="brotli")


# --------------------------------------------------------------------------
# a batch is never shorter than its count


def test_compressed_batch_shorter_than_count_is_stored_uncompressed():
    # 5,000 empty records (8 bytes each) compress with zstd to fewer than 5,000 bytes
    # (the other codecs stay above one byte per record for these records).
    plain = encode_batch([b""] * 5_000, timestamp_ms=0)
    assert HEADER_SIZE + len(rb._compress(4, plain[HEADER_SIZE:])) < 5_000
    batch = encode_batch([b""] * 5_000, timestamp_ms=0, compression="zstd")
    header = validate_batch(batch)
    assert header.codec == 0 and len(batch) >= 5_000
    assert len(decode_batch(batch).records) == 5_000


@pytest.mark.parametrize("compression", ["zstd"])
def test_client_batch_shorter_than_count_is_reencoded(compression):
    # A Kafka client's compressed batch of many empty records: lastOffsetDelta = count - 1.
    count = 5_000
    plain = encode_batch([b""] * count, timestamp_ms=0)
    section = rb._compress(rb._codec_of(compression), plain[HEADER_SIZE:])
    head = bytearray(plain[:HEADER_SIZE])
    struct.pack_into(">h", head, 21, rb._codec_of(compression))
    client = _with_records_section(bytes(head), section)
    buf = bytearray(client)
    struct.pack_into(">i", buf, 23, count - 1)
    client = _reseal(bytes(buf))
    header = validate_batch(client)
    assert needs_reencode(header) and header.size < count
    fixed = reencode_uncompressed(client)
    fixed_header = validate_batch(fixed)
    assert not needs_reencode(fixed_header) and fixed_header.codec == 0
    assert fixed_header.last_offset_delta == len(fixed) - 1
    assert [r.value for r in decode_batch(fixed).records] == [b""] * count


# --------------------------------------------------------------------------
# stamping a Kafka client's batch


def test_stamp_rewrites_client_last_offset_delta_and_crc():
    batch = bytearray(encode_batch([b"a", b"b", b"c"], timestamp_ms=0))
    struct.pack_into(">i", batch, 23, 2)  # count - 1, as Kafka clients write
    client = _reseal(bytes(batch))
    assert validate_batch(client).last_offset_delta == 2
    buf = bytearray(b"\xee" * 10 + client)
    stamp_into(buf, 10, 777, 4)
    assert buf[:10] == b"\xee" * 10
    header = validate_batch(buf, 10)  # the crc is right again
    assert (header.base_offset, header.partition_leader_epoch) == (777, 4)
    assert header.last_offset_delta == len(client) - 1
    assert header.next_offset == 777 + len(client)


# --------------------------------------------------------------------------
# formats and iteration


def test_format_at_tells_the_formats_apart():
    v1 = encode_message_set([b"a", b"b"], timestamp_ms=2)  # byte 16 of the timestamp is 0
    v1_ts2 = encode_message_set([b"a"], timestamp_ms=0x0200)  # byte 16 is 2 here
    v2 = encode_batch([b"a"], timestamp_ms=0)
    assert v1_ts2[16] == 2
    assert format_at(v1) == format_at(v1_ts2) == 1
    assert format_at(v2) == format_at(stamp(v2, 1 << 40)) == 2
    assert format_at(b"\x07" * 40) is None
    assert format_at(v2[:10]) is None


def test_iter_batches_back_to_back_and_cut_tail():
    batches = [stamp(encode_batch([b"x" * n], timestamp_ms=0), 0) for n in (1, 10, 100)]
    buf = b"".join(batches)
    seen = list(iter_batches(buf + batches[0][:30]))
    assert [pos for pos, _ in seen] == [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    assert [h.count for _, h in seen] == [1, 1, 1]
    with pytest.raises(InvalidMessageError, match="magic"):
        list(iter_batches(buf + b"\x00" * 70))


# --------------------------------------------------------------------------
# bad batches: typed errors


def _good():
    return encode_batch([b"alpha", b"beta"], [b"k", None], timestamp_ms=0)


def test_corrupt_crc():
    buf = bytearray(_good())
    buf[-1] ^= 0xFF
    with pytest.raises(CorruptMessageError, match="CRC32C") as err:
        validate_batch(bytes(buf))
    assert err.value.offset == 0
    with pytest.raises(CorruptMessageError):
        decode_batch(bytes(buf))


@pytest.mark.parametrize("cut", [0, 5, 11, 12, 60, -1])
def test_truncated(cut):
    good = _good()
    with pytest.raises(InvalidMessageError, match="incomplete") as err:
        validate_batch(good[:cut] if cut >= 0 else good[:-1])
    assert err.value.partial


def test_oversize_refused_from_the_length_field():
    batch = encode_batch([b"x" * 2_000], timestamp_ms=0)
    with pytest.raises(MessageTooLargeError, match="max_message_bytes") as err:
        validate_batch(batch, max_message_bytes=1_000)
    assert err.value.size == len(batch) - 12
    # only the 12-byte prefix is needed to refuse it
    with pytest.raises(MessageTooLargeError):
        validate_batch(struct.pack(">qi", 0, 1 << 30), max_message_bytes=1_000)


def test_bad_magic_attributes_count_and_length():
    good = _good()
    buf = bytearray(good)
    buf[16] = 1
    with pytest.raises(InvalidMessageError, match="magic 1"):
        validate_batch(bytes(buf))
    buf = bytearray(good)
    struct.pack_into(">h", buf, 21, 0x40)
    with pytest.raises(InvalidMessageError, match="unknown attributes"):
        validate_batch(_reseal(bytes(buf)))
    buf = bytearray(good)
    struct.pack_into(">h", buf, 21, 5)  # codec 5 does not exist
    with pytest.raises(InvalidMessageError, match="unknown attributes"):
        validate_batch(_reseal(bytes(buf)))
    buf = bytearray(good)
    struct.pack_into(">i", buf, 57, 0)
    with pytest.raises(InvalidMessageError, match="at least one record"):
        validate_batch(_reseal(bytes(buf)))
    buf = bytearray(good)
    struct.pack_into(">i", buf, 23, 5)
    with pytest.raises(InvalidMessageError, match="lastOffsetDelta"):
        validate_batch(_reseal(bytes(buf)))
    with pytest.raises(InvalidMessageError, match="less than the minimum"):
        validate_batch(struct.pack(">qi", 0, 10) + b"\x00" * 60)


def test_count_larger_than_the_bytes_allow():
    good = _good()
    buf = bytearray(good)
    struct.pack_into(">i", buf, 57, 1_000_000)
    struct.pack_into(">i", buf, 23, len(good) - 1)
    with pytest.raises(InvalidMessageError, match="more than its .* bytes of records can hold"):
        validate_batch(_reseal(bytes(buf)))
    buf = bytearray(good)
    struct.pack_into(">i", buf, 57, 3)  # one more than there are, within the 7-byte bound
    with pytest.raises(InvalidMessageError, match="record 2"):
        validate_batch(_reseal(bytes(buf)))


def test_count_smaller_than_the_records_leaves_bytes_over():
    buf = bytearray(_good())
    struct.pack_into(">i", buf, 57, 1)
    with pytest.raises(InvalidMessageError, match="follow the last"):
        validate_batch(_reseal(bytes(buf)))


@pytest.mark.parametrize(
    "section, match",
    [
        (b"\xff\xff\xff\xff\xff\xff" + b"\x00" * 10, "longer than 5 bytes"),
        (b"\x0c\x00\x00\x02\x01\x01\x00", "offsetDelta is 1, expected 0"),
        (b"\x0c\x00\x00\x00\x7f\x01\x00", "key length"),  # key length -64
        (b"\x0c\x00\x00\x00\x01\x20\x00", "value length"),  # value length 16 > room
        (b"\x0c\x05\x00\x00\x01\x01\x00", "attributes"),
        (b"\x0c\x00\x00\x00\x01\x01\x01", "header"),  # header count -1
        (b"\x0e\x00\x00\x00\x01\x01\x00\x00", "end 1 bytes before"),
        (b"\x10\x00\x00\x00\x01\x01\x02\x02\xff\x01", "UTF-8"),
        (b"\x0c\x00\x04\x00\x01\x01\x00", "later than the batch's maxTimestamp"),
    ],
)
def test_bad_records(section, match):
    bad = _with_records_section(encode_batch([b"x"], timestamp_ms=0), section, count=1)
    with pytest.raises(InvalidMessageError, match=match) as err:
        validate_batch(bad)
    assert err.value.offset == 0
    with pytest.raises(InvalidMessageError, match=match):
        decode_batch(bad)


def test_varint_out_of_range():
    # a 5-byte varint whose value needs more than 32 bits
    bad = _with_records_section(encode_batch([b"x"], timestamp_ms=0), b"\x80\x80\x80\x80\x7f" + b"\x00" * 8, count=1)
    with pytest.raises(InvalidMessageError, match="out of range"):
        validate_batch(bad)


def test_a_bad_batch_loses_nothing_of_the_good_ones():
    good = [stamp(encode_batch([b"a%d" % i], timestamp_ms=0), 0) for i in range(3)]
    bad = bytearray(good[1])
    bad[-1] ^= 1
    buf = good[0] + bytes(bad) + good[2]
    assert validate_batch(buf, 0).count == 1
    with pytest.raises(CorruptMessageError):
        validate_batch(buf, len(good[0]))
    assert decode_batch(buf, len(good[0]) + len(bad)).records[0].value == b"a2"


# --------------------------------------------------------------------------
# zip bombs, per codec


def _bomb(codec: int, size: int) -> bytes:
    data = b"\x00" * size
    if codec == 1:
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == 2:
        return snappy_compress(data)
    if codec == 3:
        return lz4.frame.compress(data, store_size=False)
    return zstandard.ZstdCompressor(write_content_size=True).compress(data)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_zip_bomb_refused_per_codec(codec):
    head = bytearray(encode_batch([b"x"], timestamp_ms=0)[:HEADER_SIZE])
    struct.pack_into(">h", head, 21, codec)
    bomb = _with_records_section(bytes(head), _bomb(codec, 50_000_000), count=1)
    assert len(bomb) < 5_000_000  # 50 MB inflated
    with pytest.raises(InflatedSizeTooLargeError) as err:
        validate_batch(bomb, max_message_bytes=4 << 20, max_inflated_bytes=1 << 20)
    assert err.value.offset == 0
    with pytest.raises(InflatedSizeTooLargeError):
        decode_batch(bomb, max_message_bytes=4 << 20)  # default bound: 8 x max_message_bytes, 32 MiB


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_records_not_a_stream_of_the_codec(codec):
    head = bytearray(encode_batch([b"x"], timestamp_ms=0)[:HEADER_SIZE])
    struct.pack_into(">h", head, 21, codec)
    bad = _with_records_section(bytes(head), b"\x02garbage-not-compressed", count=1)
    with pytest.raises(InvalidMessageError, match=rb.KAFKA_CODECS[codec]):
        validate_batch(bad)


# --------------------------------------------------------------------------
# snappy: both framings


def test_snappy_reads_raw_and_xerial_and_writes_xerial():
    data = bytes(range(256)) * 1_000
    framed = snappy_compress(data)
    assert framed.startswith(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01")
    assert snappy_decompress(framed, len(data)) == data
    raw = bytes(cramjam.snappy.compress_raw(data))
    assert snappy_decompress(raw, len(data)) == data
    with pytest.raises(InflatedSizeTooLargeError):
        snappy_decompress(raw, len(data) - 1)
    with pytest.raises(InflatedSizeTooLargeError):
        snappy_decompress(framed, len(data) - 1)
    with pytest.raises(InvalidMessageError, match="cut"):
        snappy_decompress(framed[:18], len(data))


def test_raw_snappy_batch_as_librdkafka_writes_it():
    plain = encode_batch([b"r%d" % i for i in range(20)], timestamp_ms=0)
    head = bytearray(plain[:HEADER_SIZE])
    struct.pack_into(">h", head, 21, 2)
    batch = _with_records_section(bytes(head), bytes(cramjam.snappy.compress_raw(plain[HEADER_SIZE:])))
    assert [r.value for r in decode_batch(batch).records] == [b"r%d" % i for i in range(20)]


def test_zstd_without_content_size_as_java_writes_it():
    plain = encode_batch([b"z%d" % i for i in range(50)], timestamp_ms=0)
    co = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    section = co.compress(plain[HEADER_SIZE:]) + co.flush()
    assert zstandard.frame_content_size(section) == -1
    head = bytearray(plain[:HEADER_SIZE])
    struct.pack_into(">h", head, 21, 4)
    batch = _with_records_section(bytes(head), section)
    assert [r.value for r in decode_batch(batch).records] == [b"z%d" % i for i in range(50)]
    # the same bounds as for every codec: a bomb, a cut frame, trailing bytes
    co = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    bomb = _with_records_section(bytes(head), co.compress(b"\x00" * 20_000_000) + co.flush(), count=1)
    with pytest.raises(InflatedSizeTooLargeError):
        validate_batch(bomb, max_inflated_bytes=1 << 20)
    with pytest.raises(InvalidMessageError, match="truncated"):
        validate_batch(_with_records_section(bytes(head), section[:-5]))
    with pytest.raises(InvalidMessageError, match="trailing"):
        validate_batch(_with_records_section(bytes(head), section + b"\x00\x01"))


def test_lz4_frames_have_independent_blocks_as_kafkas_java_reader_requires():
    batch = encode_batch([b"l%d" % i * 50 for i in range(2_000)], timestamp_ms=0, compression="lz4")
    section = batch[HEADER_SIZE:]
    assert section[:4] == b"\x04\x22\x4d\x18"  # the lz4 frame magic
    flg, bd = section[4], section[5]
    assert flg & 0x20, "block independence must be set (Kafka's KafkaLZ4BlockInputStream refuses linked blocks)"
    assert not flg & 0x08 and (bd >> 4) & 0x7 == 4  # no content size; 64 KiB blocks
    assert len(decode_batch(batch).records) == 2_000


def test_encoder_refuses_fields_out_of_range():
    with pytest.raises(ConfigError, match="out of range"):
        encode_batch([b"a"], producer_epoch=1 << 15)
    with pytest.raises(ConfigError, match="out of range"):
        encode_batch([b"a"], base_sequence=-2)
    with pytest.raises(ConfigError, match="i64"):
        encode_batch([b"a"], timestamp_ms=1 << 63)


def _stored(sizes) -> bytes:
    """Batches of the given record counts and value sizes, stamped back to back."""
    out = bytearray()
    for count, size in sizes:
        batch = encode_batch([bytes([65 + count % 26]) * size] * count, [None] * count, timestamp_ms=7)
        out += stamp(batch, len(out))
    return bytes(out)


@pytest.mark.parametrize("sizes", [
    [(3, 10)] * 40,  # small batches: windows of many headers
    [(2, 3000)] * 6,  # each batch past the small-batch size: a read per header
    [(1, 5), (4, 2000), (1, 5), (1, 5), (3, 40_000), (2, 10), (1, 70_000), (5, 1)],  # both, and past a window
])
def test_whole_batches_in_file_answers_as_whole_batches_does_on_the_bytes(tmp_path, sizes):
    data = _stored(sizes)
    path = tmp_path / "segment.log"
    path.write_bytes(b"\xff" * 100 + data)  # the range lies at a position of its file
    bounds = [pos for pos, _ in iter_batches(data)] + [len(data)]
    offsets = sorted({0, 1, 2, 3, len(data) - 1} | set(bounds[:-1]) | {b + 1 for b in bounds[:-1]})
    with open(path, "rb") as f:
        fd = f.fileno()
        for start in bounds[:-1]:
            for end in (bounds[-1], len(data) - 1, start + 61, start + 100):
                if end <= start:
                    continue
                for offset in (o for o in offsets if o >= start):
                    for max_bytes in (1, 500, 5000, 1 << 20):
                        expected = rb.whole_batches(data[start:end], offset, max_bytes)
                        assert rb.whole_batches_in_file(fd, 100 + start, end - start, offset, max_bytes) == expected
        # a file that ends before the range does (cut under the reader): the walk ends there
        cut = bounds[len(bounds) // 2] + 30
        f.close()
    path.write_bytes(b"\xff" * 100 + data[:cut])
    with open(path, "rb") as f:
        expected = rb.whole_batches(data[:cut], 0, 1 << 20)
        assert rb.whole_batches_in_file(f.fileno(), 100, len(data), 0, 1 << 20) == expected


def test_whole_batches_in_file_stops_at_format_1_bytes(tmp_path):
    path = tmp_path / "segment.log"
    path.write_bytes(encode_message_set([b"a", b"b"]) + _stored([(2, 10)]))
    with open(path, "rb") as f:
        assert rb.whole_batches_in_file(f.fileno(), 0, path.stat().st_size, 0, 1 << 20) == (0, 0, 0, 0)
