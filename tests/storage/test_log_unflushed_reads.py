"""What a follower copies from its leader's log: the bytes appended, flushed
or not (``read_unflushed``), and a long poll on the log end that an append
answers at once (``wait_for_end``), while consumers still see only what is
flushed."""

import threading
import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import ClosedError, OffsetOutOfRangeError
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set

#: flushes only when asked: what is read beyond the high watermark is unflushed
NO_TIMED_FLUSH = TopicConfig(flush_messages=1_000_000, flush_ms=600_000)
#: a bound on any wait of these tests (a loaded machine)
WAIT_S = 30.0


def test_unflushed_bytes_are_read_up_to_the_log_end_and_not_past_it(tmp_path):
    with PartitionLog(tmp_path, NO_TIMED_FLUSH) as log:
        first = encode_message_set([b"a", b"b"])
        log.append(first)
        log.flush()
        hw = log.high_watermark
        second = encode_message_set([b"c"])
        log.append(second)
        assert log.high_watermark == hw  # not flushed: consumers do not see it
        assert log.read(hw, 1 << 20).length == 0
        chunk = log.read_unflushed(hw, 1 << 20)
        assert chunk.length == len(second)
        assert log.read_unflushed(0, 1 << 20).length == len(first) + len(second)
        assert log.read_unflushed(log.log_end_offset, 1 << 20).length == 0
        with pytest.raises(OffsetOutOfRangeError):
            log.read_unflushed(log.log_end_offset + 1, 1 << 20)


def test_an_append_answers_a_wait_on_the_log_end_before_any_flush(tmp_path):
    with PartitionLog(tmp_path, NO_TIMED_FLUSH) as log:
        log.append(encode_message_set([b"a"]))
        log.flush()
        end = log.log_end_offset
        result = {}

        def follower():
            started = time.monotonic()
            result["ok"] = log.wait_for_end(end, WAIT_S)
            result["waited"] = time.monotonic() - started
            result["length"] = log.read_unflushed(end, 1 << 20).length

        thread = threading.Thread(target=follower)
        thread.start()
        deadline = time.monotonic() + WAIT_S
        while log._end_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        data = encode_message_set([b"b", b"c"])
        log.append(data)
        thread.join(WAIT_S)
        assert result["ok"] is True
        assert result["length"] >= len(data) or log.high_watermark > end
        assert result["waited"] < WAIT_S
        # the waiting follower also made the append flush at once (as before)
        deadline = time.monotonic() + WAIT_S
        while log.high_watermark < log.log_end_offset and time.monotonic() < deadline:
            time.sleep(0.005)
        assert log.high_watermark == log.log_end_offset


def test_a_wait_on_the_log_end_times_out_and_ends_at_close(tmp_path):
    log = PartitionLog(tmp_path, NO_TIMED_FLUSH)
    log.append(encode_message_set([b"a"]))
    end = log.log_end_offset
    assert log.wait_for_end(end, 0.05) is False
    assert log.wait_for_end(0, 0.05) is True
    done = threading.Event()
    thread = threading.Thread(target=lambda: (log.wait_for_end(end, WAIT_S), done.set()))
    thread.start()
    time.sleep(0.1)
    log.close()
    assert done.wait(WAIT_S)
    thread.join(WAIT_S)
    with pytest.raises(ClosedError):
        log.read_unflushed(0, 1 << 20)
