"""The in-memory log keeps the file log's contract (raylog.storage.base.Log):
the same offsets for the same sets, the same errors for bad offsets and bad
sets, the same lookups by time. (The data channel's tests run against both.)"""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import ClosedError, CorruptMessageError, InvalidOffsetError, OffsetOutOfRangeError
from raylog.storage.base import Log
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.memory import MemoryLog
from raylog.storage.message import encode_message_set

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9)


@pytest.fixture
def both(tmp_path):
    logs = [PartitionLog(tmp_path / "p", CONFIG), MemoryLog(CONFIG)]
    yield logs
    for log in logs:
        log.close()


def _sets():
    return [encode_message_set([b"v%d-%d" % (i, j) for j in range(3)], timestamp_ms=1000 * i) for i in range(5)] + [
        encode_message_set([b"z" * 100] * 4, compression="gzip", timestamp_ms=9000)
    ]


def test_both_logs_are_logs_and_give_the_same_offsets_and_bytes(both):
    assert all(isinstance(log, Log) for log in both)
    offsets = [[log.append(s) for s in _sets()] for log in both]
    assert offsets[0] == offsets[1]
    assert [log.high_watermark for log in both] == [0, 0]  # visible at the flush
    for log in both:
        log.flush()
    reads = [log.read(0, 1 << 20).tobytes() for log in both]
    assert reads[0] == reads[1] == b"".join(_sets())
    assert decode_messages(reads[1], 0)[0] == decode_messages(reads[0], 0)[0]


def test_the_same_errors_for_bad_offsets_and_bad_sets(both):
    for log in both:
        log.append(_sets()[0])
        log.flush()
        with pytest.raises(OffsetOutOfRangeError):
            log.read(log.high_watermark + 1, 100)
        with pytest.raises(InvalidOffsetError):
            log.read(3, 100)
        damaged = bytearray(_sets()[1])
        damaged[-1] ^= 0xFF
        with pytest.raises(CorruptMessageError):
            log.append(bytes(damaged))
        assert log.read(0, 1 << 20).tobytes() == _sets()[0]  # what was accepted is intact


def test_lookups_by_time_agree(both):
    for log in both:
        for s in _sets():
            log.append(s)
        log.flush()
    for t in (0, 1000, 2500, 4000, 9000, 10_000):
        assert both[0].offset_for_time(t) == both[1].offset_for_time(t), t


def test_a_closed_memory_log_refuses_and_wakes_its_waiters():
    log = MemoryLog(CONFIG)
    log.close()
    assert log.wait_for_data(0, 5.0) is False  # returns at once
    with pytest.raises(ClosedError):
        log.append(_sets()[0])
