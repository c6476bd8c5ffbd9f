"""A follower's log as readers see it (FollowerView): served up to the high
watermark learned from the leader, never its own log end beyond it; empty
(a bounded long poll) above it up to its log end; OffsetOutOfRangeError past
its log; no writes."""

from __future__ import annotations

import threading

import pytest

from raylog.config import TopicConfig
from raylog.errors import NotOwnerError, OffsetOutOfRangeError
from raylog.replication.follower_reads import FollowerView, ServedWatermark
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set


@pytest.fixture
def follower(tmp_path):
    """A follower log holding three sets of the leader's bytes (flushed), and its view."""
    leader = PartitionLog(tmp_path / "leader", TopicConfig())
    ends = []
    for values in ([b"a", b"bb"], [b"ccc"], [b"dddd", b"e"]):
        leader.append(encode_message_set(values))
        ends.append(leader.log_end_offset)
    leader.flush()
    log = PartitionLog(tmp_path / "follower", TopicConfig())
    log.append_replica(leader.read(0, 1 << 20).tobytes(), 0)
    log.flush()
    watermark = ServedWatermark()
    try:
        yield FollowerView(log, watermark, "disk-b"), watermark, log, ends
    finally:
        watermark.close()
        log.close()
        leader.close()


def test_a_follower_serves_only_up_to_the_high_watermark_it_learned(follower):
    view, watermark, log, ends = follower
    assert view.high_watermark == 0 and view.read(0, 1 << 20).length == 0  # nothing learned yet
    watermark.learn(ends[0])
    assert view.high_watermark == ends[0]
    assert view.read(0, 1 << 20).tobytes() == log.read(0, ends[0]).tobytes()[: ends[0]]
    assert view.read(0, 1 << 20).length == ends[0]  # its own log end (ends[2]) is not served
    assert view.read(ends[0], 1 << 20).length == 0  # at the served end: empty, as the leader answers
    assert view.read(ends[1], 1 << 20).length == 0  # above it, within its log: empty (not yet learned)
    watermark.learn(ends[1] - 0)
    watermark.learn(ends[0])  # a lower value (a new leader starting) never lowers it
    assert view.high_watermark == ends[1]
    assert view.read(ends[0], 1 << 20).length == ends[1] - ends[0]
    watermark.learn(ends[2] + 1000)  # the leader has more than this follower: its own log end bounds it
    assert view.high_watermark == ends[2] == log.high_watermark
    assert view.offset_for_time(0) == 0
    watermark.cap(ends[1])  # truncated to a new epoch's start: serves no more than that
    assert view.high_watermark == ends[1]
    watermark.learn(ends[2])
    with pytest.raises(OffsetOutOfRangeError) as info:
        view.read(ends[2] + 7, 1 << 20)  # past the follower's log: ask the leader
    assert info.value.earliest == 0 and info.value.latest == ends[2]


def test_a_long_poll_at_a_follower_is_bounded_and_sees_what_it_learns(follower):
    view, watermark, _, ends = follower
    watermark.learn(ends[0])
    assert not view.wait_for_data(ends[0], 0.05)  # bounded: nothing learned, returns after the timeout
    timer = threading.Timer(0.1, watermark.learn, args=(ends[1],))
    timer.start()
    try:
        assert view.wait_for_data(ends[0], 10.0)
    finally:
        timer.cancel()
    assert view.read(ends[0], 1 << 20).length == ends[1] - ends[0]


def test_a_follower_refuses_writes(follower):
    view = follower[0]
    for call in (lambda: view.append(b"x"), lambda: view.append_sequenced(b"x", 1, 0, 0, [1]),
                 view.before_acks_all, view.flush):
        with pytest.raises(NotOwnerError):
            call()
