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
