"""Reading logs of both formats (docs/design.md §2): decode_messages hands
out format 2's records (headers, null apart from empty, control batches
passed over), COUNT counts them (and may stop inside a batch), and a log
written in format 1 by the code before format 2 (tests/storage/fixtures/format1-log)
opens, reads, takes format 2 and reads again -- file log and memory log."""

from __future__ import annotations

import os
import shutil

import pytest

from raylog.config import TopicConfig
from raylog.consumer.record import Message
from raylog.errors import CorruptMessageError, InvalidMessageError, InvalidOffsetError
from raylog.storage.counting import count_range, count_records
from raylog.storage.decoding import HeadedRecord, decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.memory import MemoryLog
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import encode_batch, read_header

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9)
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "format1-log")
#: what the fixture holds: written once by PartitionLog of the code before format 2 was stored
#: (segment_bytes=300, max_message_bytes=256; the sets: ["one", "two"] with keys ["k1", None] at
#: 1000 ms, ["three"] at 2000, "w0".."w19" gzip at 3000, ["", "six"] at 4000, ["seven"] at 5000),
#: closed cleanly, its lock file removed
FIXTURE_VALUES = [b"one", b"two", b"three"] + [b"w%d" % i for i in range(20)] + [b"", b"six", b"seven"]


@pytest.fixture(params=["file", "memory"])
def log(request, tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG) if request.param == "file" else MemoryLog(CONFIG)
    yield log
    log.close()


def read_every_record(log, start=None, max_bytes=4096):
    """Every record from ``start`` to the high watermark, read as a consumer
    does: a slice (from the start of the wrapper or batch an offset lies
    in), decoded, the records before the asked offset skipped,
    continuing at the slice's offset + consumed."""
    offset = log.log_start_offset if start is None else start
    records = []
    while offset < log.high_watermark:
        try:
            chunk = log.read(offset, max_bytes)
        except InvalidOffsetError as err:  # inside a format-1 wrapper: read it from its start
            if "wrapper_offset" not in err.details:
                raise
            chunk = log.read(err.details["wrapper_offset"], max_bytes)
        got, consumed = decode_messages(chunk.tobytes(), chunk.offset)
        assert consumed > 0
        records.extend(r for r in got if r[0] >= offset)
        offset = chunk.offset + consumed
    assert offset == log.high_watermark
    return records


def _fill_mixed(log):
    log.append(encode_message_set([b"f1-a", b"f1-b"], timestamp_ms=1))
    log.append(encode_message_set([b"z%d" % i for i in range(30)], timestamp_ms=2, compression="zstd"))
    log.append(encode_batch([b"f2-a", None, b""], keys=[b"k", None, b"k"], timestamp_ms=3,
                            headers=[[("h", b"1"), ("h", None)], None, [("x", b"")]]))
    log.append(encode_batch([b"c%d" % i for i in range(40)], timestamp_ms=4, compression="gzip"))
    log.append_marker(1, 0, True, 0, timestamp_ms=5)
    log.append(encode_batch([b"f2-last"], timestamp_ms=6))
    log.flush()


EXPECTED = ([b"f1-a", b"f1-b"] + [b"z%d" % i for i in range(30)] + [b"f2-a", None, b""]
            + [b"c%d" % i for i in range(40)] + [b"f2-last"])


def test_decode_hands_out_records_with_headers_and_null_values():
    batch = encode_batch([b"v", None, b""], keys=[None, b"k", b""], timestamp_ms=7,
                         headers=[[("a", b"1"), ("a", None)], None, []])
    records, consumed = decode_messages(batch, 0)
    assert consumed == len(batch)
    assert records == [(0, 7, None, b"v"), (1, 7, b"k", None), (2, 7, b"", b"")]
    assert all(isinstance(r, HeadedRecord) for r in records)
    assert [r.headers for r in records] == [[("a", b"1"), ("a", None)], [], []]
    offset, ts, key, value = records[1]  # unpacks as format 1's tuples do
    assert value is None and key == b"k"


def test_decode_leaves_a_cut_batch_for_the_next_fetch_and_refuses_a_damaged_one():
    a, b = encode_batch([b"a"], timestamp_ms=1), encode_batch([b"b"], timestamp_ms=2)
    records, consumed = decode_messages(a + b[:-3], 0)
    assert consumed == len(a) and [r[3] for r in records] == [b"a"]
    with pytest.raises(InvalidMessageError):
        decode_messages(a + b[:-3], 0, partial_tail_ok=False)
    damaged = bytearray(a + b)
    damaged[len(a) + 64] ^= 0x10
    with pytest.raises(CorruptMessageError):
        decode_messages(bytes(damaged), 0)


def test_decode_builds_messages_with_the_batch_rule_for_next_offsets():
    batch = encode_batch([b"x", b"y", b"z"], timestamp_ms=1)
    records, consumed = decode_messages(batch, 0, record_type=Message, prefix=("t", 0))
    assert [m.value for m in records] == [b"x", b"y", b"z"]
    assert [m.next_offset for m in records] == [1, 2, len(batch)]
    assert read_header(batch).next_offset == len(batch) == consumed


def test_a_mixed_log_reads_every_record_once_in_order(log):
    _fill_mixed(log)
    assert [r[3] for r in read_every_record(log)] == EXPECTED
    offsets = [r[0] for r in read_every_record(log)]
    assert offsets == sorted(set(offsets))


def test_a_mixed_log_reads_from_a_record_inside_a_batch(log):
    _fill_mixed(log)
    records = read_every_record(log)
    inside = records[32 + 3 + 5]  # the sixth record of the gzip batch
    assert inside[3] == b"c5"
    assert [r[3] for r in read_every_record(log, inside[0])] == EXPECTED[EXPECTED.index(b"c5"):]


def test_count_counts_the_records_of_both_formats(log):
    _fill_mixed(log)
    counted = count_range(log, log.log_start_offset, log.high_watermark, 1 << 20)
    assert counted.messages == len(EXPECTED)  # the control batch counts none
    assert count_records(log, 0, log.high_watermark, 1 << 20, -1).messages == len(EXPECTED)


def test_count_version_1_stops_inside_a_batch_and_resumes_there(log):
    _fill_mixed(log)
    records = read_every_record(log)
    gzip_batch = records[35][0]  # c0: the first record of the 40-record batch
    before = 35
    counted = count_records(log, 0, log.high_watermark, 1 << 20, before + 7)
    assert counted.messages == before + 7 and counted.next_offset == gzip_batch + 7
    rest = count_records(log, counted.next_offset, log.high_watermark, 1 << 20, -1)
    assert rest.messages == len(EXPECTED) - before - 7


def test_a_format_1_log_from_before_opens_reads_and_takes_format_2(tmp_path):
    directory = tmp_path / "format1-log"
    shutil.copytree(FIXTURE, directory)
    log = PartitionLog(directory, CONFIG)
    assert log.recovery_reports == []
    assert [r[3] for r in read_every_record(log)] == FIXTURE_VALUES
    old_bases = log.segment_bases
    at = log.append(encode_batch([b"new-1", None], timestamp_ms=9_000))
    log.append(encode_batch([b"new-2"], timestamp_ms=9_001))
    log.flush()
    assert log.segment_bases == old_bases + [at]  # a segment of its own
    expected = FIXTURE_VALUES + [b"new-1", None, b"new-2"]
    assert [r[3] for r in read_every_record(log)] == expected
    assert count_range(log, 0, log.high_watermark, 1 << 20).messages == len(expected)
    assert log.offset_for_time(9_000) == at
    log.close()
    log = PartitionLog(directory, CONFIG)  # and again after a reopen
    assert log.recovery_reports == []
    assert [r[3] for r in read_every_record(log)] == expected
    log.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_of_both_formats_read_count_and_reopen_alike(seed, tmp_path):
    import random

    rng = random.Random(seed)
    config = TopicConfig(flush_messages=10**9, flush_ms=10**9, segment_bytes=8192, max_message_bytes=4096)
    file_log, memory_log = PartitionLog(tmp_path / "p", config), MemoryLog(config)
    expected = []
    for step in range(60):
        n = rng.randint(1, 6)
        values = [rng.choice([None, b"", b"v%d-%d" % (step, i) * rng.randint(1, 20)]) for i in range(n)]
        if rng.random() < 0.4:
            values = [b"" if v is None else v for v in values]  # format 1 has no null value
            data = encode_message_set(values, timestamp_ms=step, compression=rng.choice([None, "gzip", "zstd"]))
        else:
            data = encode_batch(values, timestamp_ms=step, compression=rng.choice([None, "gzip", "lz4", "zstd"]),
                                headers=[[("i", b"%d" % i)] for i in range(n)])
        assert file_log.append(data) == memory_log.append(data)
        expected.extend(values)
        if rng.random() < 0.3:
            file_log.flush()
            memory_log.flush()
    for log in (file_log, memory_log):
        log.flush()
        records = read_every_record(log, max_bytes=rng.choice([1, 500, 1 << 20]))
        assert [r[3] for r in records] == expected
        assert [r[0] for r in records] == sorted(set(r[0] for r in records))
        assert count_range(log, 0, log.high_watermark, 1 << 20).messages == len(expected)
        middle = records[len(records) // 2][0]
        assert [r[3] for r in read_every_record(log, middle)] == expected[len(records) // 2:]
    file_log.close()
    file_log = PartitionLog(tmp_path / "p", config)
    assert file_log.recovery_reports == []
    assert [r[3] for r in read_every_record(file_log)] == expected
    file_log.close()
    memory_log.close()


def test_a_record_type_with_a_headers_hook_gets_each_records_headers():
    class Row(tuple):
        @staticmethod
        def with_headers(row, headers):
            return (*row, headers)

    batch = encode_batch([b"a", None], timestamp_ms=4, headers=[[("h", b"1")], [("h", None), ("g", b"")]])
    rows, _consumed = decode_messages(batch, 0, record_type=Row, prefix=("t", 3))
    assert rows == [("t", 3, 0, 4, None, b"a", [("h", b"1")]), ("t", 3, 1, 4, None, None, [("h", None), ("g", b"")])]


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_the_compiled_path_builds_the_consumers_messages_as_the_reference_does(monkeypatch, compression):
    from raylog.consumer.record import Message, WrappedMessage
    from raylog.storage import record_batch

    buf = bytearray()
    for n in (1, 3, 50):
        batch = encode_batch([b"v%d" % i if i % 4 else None for i in range(n)],
                             keys=[b"k%d" % i if i % 3 else None for i in range(n)],
                             headers=[[("h", b"%d" % i), ("z", None)] if i % 2 else None for i in range(n)],
                             timestamp_ms=[1000 + i for i in range(n)], compression=compression)
        buf += record_batch.stamp(batch, len(buf))
    buf += record_batch.stamp(encode_batch([b"m"], timestamp_ms=5, control=True, transactional=True,
                                           producer_id=1, producer_epoch=0, base_sequence=-1), len(buf))
    data = bytes(buf)
    if not record_batch.ACCELERATED:
        pytest.skip("the compiled path is not built here")
    fast, consumed = decode_messages(data, 0, record_type=Message, prefix=("t", 3))
    monkeypatch.setattr(record_batch, "_speedups", None)  # the reference: decode_batch, then the hooks
    slow, consumed_slow = decode_messages(data, 0, record_type=Message, prefix=("t", 3))
    assert consumed == consumed_slow == len(data)
    assert fast == slow and len(fast) == 54
    assert [type(m) for m in fast] == [type(m) for m in slow]
    assert [m.headers for m in fast] == [m.headers for m in slow]
    assert [m.next_offset for m in fast] == [m.next_offset for m in slow]
    assert sum(type(m) is WrappedMessage for m in fast) == 3  # each batch's last record
    assert fast[2].headers == [("h", b"1"), ("z", None)] and fast[0].headers == () and fast[0].value is None


def test_runs_of_plain_batches_decode_in_one_pass_around_compressed_control_and_damaged_ones(monkeypatch):
    from raylog.consumer.record import Message
    from raylog.storage import record_batch

    def batch(values, **kw):
        return encode_batch(values, headers=[[("i", v)] for v in values], timestamp_ms=7, **kw)

    parts = [batch([b"a", b"b"]), batch([b"c"]), batch([b"d", b"e"], compression="gzip"), batch([b"f"]),
             encode_batch([b"m"], timestamp_ms=5, control=True, transactional=True, producer_id=1, producer_epoch=0,
                          base_sequence=-1),
             batch([b"g", b"h", b"i"])]
    buf = bytearray()
    for part in parts:
        buf += record_batch.stamp(part, len(buf))
    cut = bytes(buf) + record_batch.stamp(batch([b"j"]), len(buf))[:40]  # a cut last batch: left for the next fetch
    decoded = {}
    for path in ("fast", "reference"):
        if path == "reference":
            monkeypatch.setattr(record_batch, "_speedups", None)
        decoded[path] = decode_messages(cut, 0, record_type=Message, prefix=("t", 0))
    (fast, used), (slow, used_slow) = decoded["fast"], decoded["reference"]
    assert used == used_slow == len(buf)
    assert fast == slow and [m.value for m in fast] == [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i"]
    assert [m.next_offset for m in fast] == [m.next_offset for m in slow]
    assert [m.headers for m in fast] == [[("i", m.value)] for m in fast]
    monkeypatch.undo()
    damaged = bytearray(buf)
    damaged[len(parts[0]) + 70] ^= 0x01  # inside the second batch's records: its crc fails
    with pytest.raises(CorruptMessageError, match=f"batch at offset {len(parts[0])} fails its CRC32C check"):
        decode_messages(bytes(damaged), 0, record_type=Message, prefix=("t", 0))


def test_the_compiled_path_leaves_records_without_a_list_to_no_collector_pass():
    """A consumer holding a million records must not pay for the garbage
    collector walking them again and again: a record holding only str, int,
    bytes and None cannot be part of a cycle, so the compiled path untracks it
    (as format 1's does), a batch's last record too (its ``__dict__`` holds
    one int); a record with headers (a list) stays tracked."""
    import gc

    from raylog.consumer.record import InnerMessage, Message, WrappedMessage
    from raylog.storage import record_batch

    if not record_batch.ACCELERATED:
        pytest.skip("the compiled path is not built here")
    data = bytes(record_batch.stamp(encode_batch([b"a", b"b", b"c"], headers=[None, [("h", b"1")], None]), 0))
    records, _ = decode_messages(data, 0, record_type=Message, prefix=("t", 0))
    assert [type(m) for m in records] == [InnerMessage, InnerMessage, WrappedMessage]
    assert [gc.is_tracked(m) for m in records] == [False, True, False]
    assert records[-1].next_offset == len(data)
    one = bytes(record_batch.stamp(encode_batch([b"a"], headers=[[("h", None)]]), 0))
    (last,), _ = decode_messages(one, 0, record_type=Message, prefix=("t", 0))
    assert type(last) is WrappedMessage and gc.is_tracked(last) and last.headers == [("h", None)]
