"""A replica's ephemeral registration (``replicas/<node>``, a real
ZooKeeper) never makes a deleted topic's nodes again: a replica that was
cut off while its topic was deleted, registering again when it is back,
gets :class:`UnknownTopicError` and the topic stays gone (it was made again
with an empty config, and every repair pass then failed reading it)."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import UnknownTopicError
from raylog.replication.state import create_state, register_replica

ENDPOINT = {"host": "127.0.0.1", "port": 1, "actor": "a"}


def test_the_first_replica_makes_the_replicas_node_and_registers(registry, zk):
    registry.create_topic("t", TopicConfig(partitions=1))
    create_state(zk, registry.paths, "t", 0, ["disk-a", "disk-b"])
    register_replica(zk, registry.paths, "t", 0, "disk-a", ENDPOINT)
    register_replica(zk, registry.paths, "t", 0, "disk-b", ENDPOINT)
    register_replica(zk, registry.paths, "t", 0, "disk-a", ENDPOINT)  # again, the same session
    assert sorted(zk.get_children(registry.paths.replicas("t", 0))) == ["disk-a", "disk-b"]


def test_a_replica_of_a_deleted_topic_does_not_make_it_again(registry, zk):
    registry.create_topic("t", TopicConfig(partitions=1))
    create_state(zk, registry.paths, "t", 0, ["disk-a", "disk-b"])
    register_replica(zk, registry.paths, "t", 0, "disk-a", ENDPOINT)
    registry.delete_topic("t")
    with pytest.raises(UnknownTopicError, match="the topic was deleted"):
        register_replica(zk, registry.paths, "t", 0, "disk-b", ENDPOINT)
    assert zk.exists(registry.paths.topic("t")) is None
    assert registry.list_topics() == []


def test_a_topic_node_without_its_config_reads_as_unknown(registry, zk):
    registry.create_topic("kept", TopicConfig(partitions=1))
    zk.create(registry.paths.topic("left"), b"")
    with pytest.raises(UnknownTopicError, match="'left' does not exist"):
        registry.topic_config("left")
    assert registry.topic_config("kept").partitions == 1
