"""Replica placement, and the follower's cut at whole messages (pure logic)."""

from __future__ import annotations

import pytest

from raylog.actors.placement import DiskNode
from raylog.config import TopicConfig
from raylog.errors import ConfigError
from raylog.replication.assignment import assign_replicas, replica_actor_name, replica_log_dir
from raylog.replication.follower import whole_messages
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import encode_batch, stamp
from raylog.replication.state import PartitionState

NODES = [DiskNode(f"disk-{c}", c, "127.0.0.1", True) for c in "abc"]


def test_replicas_of_a_partition_are_on_distinct_nodes_and_leaders_spread():
    placed = assign_replicas(6, NODES, 3, offset=1)
    assert all(len({n.identity for n in replicas}) == 3 for replicas in placed)
    assert [replicas[0].identity for replicas in placed[:3]] == ["disk-b", "disk-c", "disk-a"]
    assert [[n.identity] for n in assign_replicas(1, NODES, 1, offset=2)[0]] == [["disk-c"]]


def test_too_few_disk_nodes_is_a_clear_error():
    with pytest.raises(ConfigError, match="replication_factor 4 needs as many alive disk nodes") as info:
        assign_replicas(2, NODES, 4)
    assert not info.value.retriable


def test_replication_settings_are_checked():
    assert TopicConfig().replication_factor == 1 and TopicConfig().min_insync_replicas == 1
    with pytest.raises(ConfigError, match="min_insync_replicas"):
        TopicConfig(replication_factor=2, min_insync_replicas=3)
    with pytest.raises(ConfigError, match="replication_factor"):
        TopicConfig(replication_factor=0)


def test_names_state_and_whole_messages():
    assert replica_actor_name("c/t/0", "disk-a", "disk-a") == "c/t/0"
    assert replica_log_dir("/d/t-0", "disk-b", "disk-a") == "/d/t-0@disk-b"
    state = PartitionState("a", 3, ("a", "b"), ("a", "b", "c"))
    assert PartitionState.from_json(state.to_json()) == state
    assert state.with_isr({"c", "a"}).isr == ("a", "c")
    one = encode_message_set([b"xyz"], None, 0)  # format 1
    assert whole_messages(one + one[:5]) == len(one)
    assert whole_messages(one * 2) == 2 * len(one)
    assert whole_messages(b"\x00\x00") == 0


def test_whole_messages_knows_record_batches():
    """A follower appends only whole entries; a record batch's length is
    12 + batchLength (its first 4 bytes are baseOffset's high half)."""
    first = stamp(encode_batch([b"a", b"bb"], timestamp_ms=0), 0)
    second = stamp(encode_batch([b"c"], timestamp_ms=0), len(first))
    data = first + second
    assert whole_messages(data) == len(data)
    for cut in (len(first) + 4, len(first) + 16, len(data) - 1):
        assert whole_messages(data[:cut]) == len(first)
    assert whole_messages(first[:16]) == 0
