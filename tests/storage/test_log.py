"""The partition log: failures first, then append, flush, read and rolling."""

import os
import threading
import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import (
    ClosedError,
    CorruptMessageError,
    InvalidMessageError,
    InvalidOffsetError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
)
from raylog.storage.log import FileSlice, PartitionLog
from raylog.storage.decoding import decode_messages
from raylog.storage.message import HEADER_SIZE, encode_message_set
from raylog.storage.segment import segment_name

from conftest import flip_byte, read_all

SMALL = TopicConfig(segment_bytes=4096, max_message_bytes=2048, flush_messages=1_000_000, flush_ms=60_000)


def msgs(*values, ts=1):
    return encode_message_set([v if isinstance(v, bytes) else v.encode() for v in values], timestamp_ms=ts)


# --------------------------------------------------------------------------
# failures


def test_read_outside_the_log_is_out_of_range_with_earliest_and_latest(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs("a", "b"))
        log.flush()
        hw = log.high_watermark
        log.append(msgs("unflushed"))
        for offset in (-1, hw + 1, log.log_end_offset, 10**12):
            with pytest.raises(OffsetOutOfRangeError) as err:
                log.read(offset, 1000)
            assert (err.value.offset, err.value.earliest, err.value.latest) == (offset, 0, hw)


def test_read_before_the_log_start_after_retention(tmp_path):
    config = SMALL.replace(retention_bytes=0)
    with PartitionLog(tmp_path, config) as log:
        for i in range(20):
            log.append(msgs("x" * 500))
        log.flush()
        log.delete_old_segments()
        start = log.log_start_offset
        assert start > 0
        with pytest.raises(OffsetOutOfRangeError) as err:
            log.read(start - 1, 100)
        assert err.value.earliest == start and err.value.latest == log.high_watermark
        with pytest.raises(OffsetOutOfRangeError):
            log.read(0, 100)


def test_offset_inside_a_message_is_invalid(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs("first message", "second message", "third"))
        log.flush()
        second = len(msgs("first message"))
        for offset in (1, 4, 8, HEADER_SIZE, second - 1, second + 1, second + 9):
            with pytest.raises(InvalidOffsetError) as err:
                log.read(offset, 1000)
            assert err.value.offset == offset
        assert log.read(second, 1000).offset == second


def test_flipped_byte_on_disk_is_reported_with_its_offset(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs("first", "second", "third"))
        log.flush()
        second = len(msgs("first"))
        flip_byte(tmp_path / segment_name(0), second + HEADER_SIZE + 2)
        chunk = log.read(0, 10_000)
        data = os.pread(chunk.file.fileno(), chunk.length, chunk.position)
        with pytest.raises(CorruptMessageError) as err:
            decode_messages(data, chunk.offset)
        assert err.value.offset == second
        # reading at the damaged message itself says so too
        with pytest.raises(CorruptMessageError) as err:
            log.read(second, 10_000)
        assert err.value.offset == second


def test_bad_sets_are_refused_and_nothing_is_written(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs("ok"))
        end, size = log.log_end_offset, os.path.getsize(tmp_path / segment_name(0))
        good = msgs("one", "two")
        damaged = bytearray(good)
        damaged[-1] ^= 1
        with pytest.raises(CorruptMessageError) as err:
            log.append(bytes(damaged))
        assert err.value.offset == len(msgs("one"))
        with pytest.raises(InvalidMessageError):
            log.append(good[:-3])
        with pytest.raises(MessageTooLargeError):
            log.append(msgs("x" * 3000))
        with pytest.raises(MessageTooLargeError):  # the set as a whole is bounded too
            log.append(msgs(*["y" * 500] * 5))
        assert log.log_end_offset == end
        assert os.path.getsize(tmp_path / segment_name(0)) == size


def test_closed_log_refuses_calls(tmp_path):
    log = PartitionLog(tmp_path, SMALL)
    log.close()
    log.close()  # idempotent
    with pytest.raises(ClosedError):
        log.append(msgs("a"))
    with pytest.raises(ClosedError):
        log.read(0, 10)
    assert log.delete_old_segments() == []
    assert log.maybe_flush() is False


# --------------------------------------------------------------------------
# append and flush


def test_appends_become_visible_only_at_flush(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        first = log.append(msgs("a", "b"))
        second = log.append(msgs("c"))
        assert (first, second) == (0, len(msgs("a", "b")))
        assert log.high_watermark == 0 and log.log_end_offset == second + len(msgs("c"))
        assert log.unflushed_messages == 3
        empty = log.read(0, 100)
        assert isinstance(empty, FileSlice) and empty.length == 0 and empty.offset == 0
        assert log.flush() is True
        assert log.flush() is False
        assert log.high_watermark == log.log_end_offset and log.unflushed_messages == 0
        assert [r[3] for r in read_all(log)] == [b"a", b"b", b"c"]
        assert log.read(log.high_watermark, 100).length == 0


def test_flush_after_flush_messages(tmp_path):
    with PartitionLog(tmp_path, SMALL.replace(flush_messages=5)) as log:
        log.append(msgs("1", "2"))
        log.append(msgs("3", "4"))
        time.sleep(0.05)
        assert log.high_watermark == 0 and log.unflushed_messages == 4
        log.append(msgs("5"))  # starts a flush on a background thread
        end = log.log_end_offset
        assert log.wait_for_data(end - 1, 60)
        assert log.high_watermark == end and log.unflushed_messages == 0


def test_appends_continue_while_a_triggered_flush_runs(tmp_path):
    with PartitionLog(tmp_path, SMALL.replace(flush_messages=10, segment_bytes=1 << 20)) as log:
        for i in range(500):
            log.append(msgs(f"m{i}", f"n{i}"))
        log.flush()
        assert len(read_all(log)) == 1000


def test_maybe_flush_after_flush_ms(tmp_path):
    now = [1000.0]
    with PartitionLog(tmp_path, SMALL.replace(flush_ms=50), clock=lambda: now[0]) as log:
        assert log.maybe_flush() is False  # nothing to flush
        log.append(msgs("a"))
        now[0] += 0.020
        log.append(msgs("b"))
        now[0] += 0.020
        assert log.maybe_flush() is False and log.high_watermark == 0
        now[0] += 0.011  # 51 ms since the first unflushed append
        assert log.maybe_flush() is True and log.high_watermark == log.log_end_offset
        assert log.maybe_flush() is False


def test_empty_set_is_a_no_op(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs("a"))
        assert log.append(b"") == log.log_end_offset and log.unflushed_messages == 1


def test_every_codec_round_trips_through_the_log(tmp_path, compression):
    with PartitionLog(tmp_path, SMALL) as log:
        sets = [[f"set{i}-msg{j}".encode() * (j + 1) for j in range(5)] for i in range(40)]
        bases = []
        for values in sets:
            keys = [None if j % 2 else f"k{j}".encode() for j in range(len(values))]
            bases.append(log.append(encode_message_set(values, keys, 7, compression)))
        log.flush()
        assert len(log.segment_bases) > 1
        records = read_all(log)
        assert [r[3] for r in records] == [v for values in sets for v in values]
        assert {r[0] for r in records} >= set(bases)
        if compression is not None:
            assert [r[0] for r in records] == [b + i for b in bases for i in range(5)]


# --------------------------------------------------------------------------
# read


def test_read_returns_at_least_one_whole_message(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs("x" * 1000, "y"))
        log.flush()
        chunk = log.read(0, 1)
        assert chunk.length == HEADER_SIZE + 1000
        chunk = log.read(0, 30)  # one whole message, even past max_bytes
        records, consumed = decode_messages(os.pread(chunk.file.fileno(), chunk.length, 0), 0)
        assert [r[3] for r in records] == [b"x" * 1000] and consumed == chunk.length


def test_read_may_end_inside_a_message_and_continue(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs(*[f"m{i}" for i in range(10)]))
        log.flush()
        assert [r[3] for r in read_all(log, max_bytes=50)] == [f"m{i}".encode() for i in range(10)]


def test_roll_and_binary_search_across_many_segments(tmp_path):
    config = SMALL.replace(segment_bytes=1024, max_message_bytes=1024)
    with PartitionLog(tmp_path, config) as log:
        bases = {}
        for i in range(300):
            bases[log.append(msgs(f"message {i:04d}" * (1 + i % 7)))] = i
        log.flush()
        assert len(log.segment_bases) > 15
        assert log.segment_bases == sorted(log.segment_bases)
        assert all(os.path.getsize(tmp_path / segment_name(b)) <= 1024 for b in log.segment_bases)
        for offset, i in bases.items():
            chunk = log.read(offset, 100_000)
            base = max(b for b in log.segment_bases if b <= offset)
            assert chunk.position == offset - base
            assert chunk.position + chunk.length <= os.path.getsize(tmp_path / segment_name(base))
            (first, *_), _ = decode_messages(os.pread(chunk.file.fileno(), chunk.length, chunk.position), offset)
            assert first[0] == offset and first[3] == f"message {i:04d}".encode() * (1 + i % 7)
        assert len(read_all(log, max_bytes=100_000)) == 300


def test_slice_stays_readable_after_its_segment_is_deleted(tmp_path):
    with PartitionLog(tmp_path, SMALL.replace(retention_bytes=0)) as log:
        for _ in range(10):
            log.append(msgs("z" * 1000))
        log.flush()
        chunk = log.read(0, 100_000)
        expected = os.pread(chunk.file.fileno(), chunk.length, chunk.position)
        assert log.delete_old_segments()
        assert not (tmp_path / segment_name(0)).exists()
        assert os.pread(chunk.file.fileno(), chunk.length, chunk.position) == expected
        del chunk  # the last reference closes the file


# --------------------------------------------------------------------------
# waiting for data


def test_wait_for_data_wakes_on_flush(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs("a"))
        log.flush()
        hw = log.high_watermark
        assert log.wait_for_data(0, 0) is True
        assert log.wait_for_data(hw, 0.01) is False
        result = {}
        started = threading.Event()

        def wait():
            started.set()
            t0 = time.monotonic()
            result["ok"] = log.wait_for_data(hw, 60)
            result["waited"] = time.monotonic() - t0

        thread = threading.Thread(target=wait)
        thread.start()
        started.wait(10)
        log.append(msgs("b"))  # not visible yet: the waiter keeps waiting
        log.flush()
        thread.join(60)
        assert result["ok"] is True and result["waited"] < 50


def test_wait_for_appends_returns_at_an_append_and_sleeps_while_all_is_flushed(tmp_path):
    """The actor's timer sleeps here while the log is idle."""
    with PartitionLog(tmp_path, SMALL) as log:
        assert log.wait_for_appends(0.01) is False
        woke = {}

        def wait():
            woke["ok"] = log.wait_for_appends(60)

        thread = threading.Thread(target=wait)
        thread.start()
        log.append(msgs("a"))
        thread.join(60)
        assert woke == {"ok": True}
        assert log.wait_for_appends(0) is True  # still waiting for its flush
        log.flush()
        assert log.wait_for_appends(0.01) is False
        log.wake_waiting_timer()
        assert log.wait_for_appends(0) is True


def test_a_waiting_reader_sees_an_append_without_waiting_out_flush_ms(tmp_path):
    """flush_ms is a minute here: a long-polling reader makes the append
    flush at once (and only while it waits: without one, nothing flushes)."""
    with PartitionLog(tmp_path, SMALL) as log:
        log.append(msgs("quiet"))
        time.sleep(0.05)
        assert log.high_watermark == 0  # no reader waits: flush_ms applies
        assert log.wait_for_data(0, 30) is True  # a reader arrives: flushed for it
        hw = log.high_watermark
        result = {}
        started = threading.Event()

        def wait():
            started.set()
            result["ok"] = log.wait_for_data(hw, 30)

        thread = threading.Thread(target=wait)
        thread.start()
        started.wait(10)
        time.sleep(0.05)
        log.append(msgs("for the reader"))
        thread.join(30)
        assert result == {"ok": True} and log.high_watermark == log.log_end_offset


def test_wait_for_data_wakes_on_close(tmp_path):
    log = PartitionLog(tmp_path, SMALL)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("ok", log.wait_for_data(0, 60)))
    thread.start()
    time.sleep(0.05)
    log.close()
    thread.join(60)
    assert result == {"ok": False}


def test_concurrent_readers_and_one_writer(tmp_path):
    config = SMALL.replace(segment_bytes=2048, max_message_bytes=2048, flush_messages=7)
    with PartitionLog(tmp_path, config) as log:
        total = 400
        seen = []
        errors = []

        def consume():
            offset = 0
            try:
                while len(seen) < total:
                    if not log.wait_for_data(offset, 30):
                        break
                    chunk = log.read(offset, 700)
                    records, consumed = decode_messages(
                        os.pread(chunk.file.fileno(), chunk.length, chunk.position), offset
                    )
                    seen.extend(r[3] for r in records)
                    offset += consumed
            except Exception as err:  # noqa: BLE001
                errors.append(err)

        reader = threading.Thread(target=consume)
        reader.start()
        for i in range(total):
            log.append(msgs(f"value {i}"))
        log.flush()
        reader.join(60)
        assert not errors
        assert seen == [f"value {i}".encode() for i in range(total)]


def test_offsets_before(tmp_path):
    with PartitionLog(tmp_path, SMALL) as log:
        for _ in range(12):
            log.append(msgs("q" * 900))
        log.flush()
        bases = log.segment_bases
        assert len(bases) >= 3
        for i, base in enumerate(bases):
            os.utime(tmp_path / segment_name(base), (1000 + i, 1000 + i))
        assert log.offsets_before(-1) == [log.high_watermark]
        assert log.offsets_before(-2) == [0]
        assert log.offsets_before(1001_500, max_offsets=5) == [bases[1], bases[0]]
        assert log.offsets_before(999_000) == []


def test_a_failed_sync_fails_every_later_call(tmp_path, monkeypatch):
    from raylog.errors import StorageError
    from raylog.storage.segment import LogSegment

    def broken(self):
        raise OSError(5, "Input/output error")

    log = PartitionLog(tmp_path, SMALL.replace(flush_messages=2))
    monkeypatch.setattr(LogSegment, "flush", broken)
    log.append(msgs("a", "b"))  # the background flush fails
    deadline = time.monotonic() + 30
    while log._failed is None and time.monotonic() < deadline:  # noqa: SLF001
        time.sleep(0.01)
    with pytest.raises(StorageError, match="disk error"):
        log.append(msgs("c"))
    with pytest.raises(StorageError):
        log.flush()
    assert log.high_watermark == 0
    log.close()  # does not try to flush again


def test_triggered_flushes_work_in_a_forked_child(tmp_path):
    with PartitionLog(tmp_path / "parent", SMALL.replace(flush_messages=1)) as log:
        log.append(msgs("a"))  # the parent now has flush threads
        assert log.wait_for_data(0, 60)
    pid = os.fork()
    if pid == 0:  # the child: no threads but this one
        code = 1
        try:
            with PartitionLog(tmp_path / "child", SMALL.replace(flush_messages=1)) as child:
                child.append(msgs("b"))
                code = 0 if child.wait_for_data(0, 30) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_appends_during_a_background_flush_are_flushed_when_due_without_the_timer(tmp_path):
    import time as _time

    from raylog.config import TopicConfig as _Config
    from raylog.storage.log import PartitionLog as _Log
    from raylog.storage.message import encode_message_set as _encode

    with _Log(tmp_path / "p", _Config(flush_messages=1, flush_ms=10**9)) as plog:
        for i in range(200):
            plog.append(_encode([b"m%d" % i]))
        deadline = _time.monotonic() + 30
        while plog.high_watermark < plog.log_end_offset and _time.monotonic() < deadline:
            _time.sleep(0.01)
        assert plog.high_watermark == plog.log_end_offset
