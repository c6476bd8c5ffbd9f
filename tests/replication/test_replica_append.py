"""PartitionLog.append_replica: a leader's bytes at the same byte offset."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import CorruptMessageError, InvalidOffsetError
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set


def test_append_replica_keeps_offsets_and_refuses_a_gap_or_bad_bytes(tmp_path):
    leader = PartitionLog(tmp_path / "leader", TopicConfig())
    follower = PartitionLog(tmp_path / "follower", TopicConfig())
    for values in ([b"a", b"bb"], [b"ccc"]):
        leader.append(encode_message_set(values))
    leader.flush()
    data = leader.read(0, 1 << 20).tobytes()
    with pytest.raises(InvalidOffsetError):
        follower.append_replica(data, 7)  # not the follower's log end
    bad = bytearray(data)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptMessageError):
        follower.append_replica(bytes(bad), 0)
    assert follower.log_end_offset == 0  # nothing of a refused set was written
    assert follower.append_replica(data, 0) == 0
    follower.flush()
    assert follower.read(0, 1 << 20).tobytes() == data and follower.log_end_offset == leader.log_end_offset
    leader.close()
    follower.close()


def test_a_replica_behind_the_leaders_log_start_starts_over_there(tmp_path):
    # The leader's retention deleted what this replica would fetch next: it
    # drops what it holds and follows from the leader's log start, also
    # after a reopen.
    from raylog.errors import OffsetOutOfRangeError
    from raylog.replication.follower import start_over_if_behind

    directory = tmp_path / "replica"
    log = PartitionLog(directory, TopicConfig())
    old = encode_message_set([b"old"])
    log.append_replica(old, 0)
    log.flush()
    behind = OffsetOutOfRangeError("before the log start", offset=len(old), earliest=5000, latest=9000)
    assert start_over_if_behind(log, len(old), behind, "disk-b of t-0")
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (5000, 5000, 5000)
    assert log.read(5000, 1 << 20).length == 0
    new = encode_message_set([b"new", b"newer"])
    log.append_replica(new, 5000)
    log.flush()
    assert log.read(5000, 1 << 20).tobytes() == new
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 1 << 20)
    log.close()
    reopened = PartitionLog(directory, TopicConfig())
    assert (reopened.log_start_offset, reopened.log_end_offset) == (5000, 5000 + len(new))
    assert reopened.read(5000, 1 << 20).tobytes() == new
    # any other out-of-range answer is not a reason to start over
    ahead = OffsetOutOfRangeError("past the log end", offset=99_999, earliest=5000, latest=9000)
    assert not start_over_if_behind(reopened, 99_999, ahead, "disk-b of t-0")
    with pytest.raises(InvalidOffsetError):
        reopened.restart_replica_at(100)  # never backwards: that is truncate_replica's work
    assert reopened.log_end_offset == 5000 + len(new)
    reopened.close()
