"""A group's Kafka-protocol members in ZooKeeper (raylog.groups.kafka_members):
a raylog member refuses to join a group that has them, on real ZooKeeper."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import MixedGroupError
from raylog.groups import kafka_members
from raylog.groups.member import GroupMember
from raylog.zk.paths import Paths

WAIT_S = 30.0


@pytest.fixture
def topic(registry):
    registry.create_topic("t", TopicConfig(partitions=2))
    return "t"


def test_publish_withdraw_and_live(make_zk, cluster_name):
    listener = make_zk()
    paths = Paths(cluster_name)
    assert kafka_members.live(listener, paths, "g") == {}
    kafka_members.publish(listener, paths, "g", "node-a", ["m2", "m1"])
    kafka_members.publish(listener, paths, "g", "node-a", ["m2", "m1", "m3"])  # updated in place
    assert kafka_members.live(listener, paths, "g") == {"node-a": ["m1", "m2", "m3"]}
    kafka_members.publish(listener, paths, "g", "node-b", [])  # a listener with none counts for nothing
    assert kafka_members.live(listener, paths, "g") == {"node-a": ["m1", "m2", "m3"]}
    kafka_members.withdraw(listener, paths, "g", "node-a")
    kafka_members.withdraw(listener, paths, "g", "node-a")  # twice is fine
    kafka_members.withdraw(listener, paths, "g", "node-b")
    assert kafka_members.live(listener, paths, "g") == {}
    # ephemeral: the listener's session takes its members with it
    kafka_members.publish(listener, paths, "g", "node-a", ["m1"])
    listener.stop()
    listener.close()
    assert kafka_members.live(make_zk(), paths, "g") == {}


def test_details_show_each_members_subscription_and_partitions(make_zk, cluster_name):
    listener = make_zk()
    paths = Paths(cluster_name)
    kafka_members.publish(listener, paths, "g", "node-a", {
        "m1": {"client_id": "web", "topics": ["clicks"], "assigned": [["clicks", 1], ["clicks", 0]]},
        "m2": {"client_id": "web", "topics": ["clicks"], "assigned": []},
    })
    kafka_members.publish(listener, paths, "g", "node-b", ["m3"])  # ids alone (an older listener)
    assert kafka_members.live(listener, paths, "g") == {"node-a": ["m1", "m2"], "node-b": ["m3"]}
    assert kafka_members.details(listener, paths, "g") == {
        "m1": {"client_id": "web", "topics": ["clicks"], "assigned": [("clicks", 0), ("clicks", 1)],
               "listener": "node-a"},
        "m2": {"client_id": "web", "topics": ["clicks"], "assigned": [], "listener": "node-a"},
        "m3": {"client_id": None, "topics": [], "assigned": [], "listener": "node-b"},
    }
    listener.set(paths.kafka_member_node("g", "node-b"), b"not json")  # counts for nothing
    assert set(kafka_members.details(listener, paths, "g")) == {"m1", "m2"}


def test_a_raylog_member_refuses_a_group_with_kafka_members(make_zk, cluster_name, topic):
    listener = make_zk()
    paths = Paths(cluster_name)
    kafka_members.publish(listener, paths, "mixed", "node-a", ["rdkafka-1"])
    member = GroupMember(make_zk(), cluster_name, "mixed", [topic])
    with pytest.raises(MixedGroupError, match="1 live Kafka-protocol member") as caught:
        member.start(timeout_s=WAIT_S)
    assert caught.value.group == "mixed" and not caught.value.retriable
    # it registered nothing and owns nothing
    zk = make_zk()
    assert not zk.exists(paths.member("mixed", member.consumer_id))
    assert member.assignment == frozenset()
    # once the Kafka members are gone, a raylog member joins and gets the whole topic
    kafka_members.withdraw(listener, paths, "mixed", "node-a")
    other = GroupMember(make_zk(), cluster_name, "mixed", [topic])
    try:
        assert other.start(timeout_s=WAIT_S) == {(topic, 0), (topic, 1)}
    finally:
        other.close()


def test_deleting_a_group_is_refused_while_it_has_kafka_members(make_zk, zk, cluster_name):
    from raylog.errors import GroupActiveError
    from raylog.groups.admin import delete_group, list_groups
    from raylog.groups.offsets import OffsetStore

    listener = make_zk()
    paths = Paths(cluster_name)
    OffsetStore(zk, cluster_name).commit("kg", "t", 0, 42)
    kafka_members.publish(listener, paths, "kg", "node-a", ["rdkafka-1"])
    with pytest.raises(GroupActiveError, match="rdkafka-1"):
        delete_group(zk, cluster_name, "kg")
    assert OffsetStore(zk, cluster_name).committed("kg", "t", 0) == 42  # nothing lost
    # the Kafka member left (its empty parent node stays behind): the group deletes cleanly
    kafka_members.withdraw(listener, paths, "kg", "node-a")
    delete_group(zk, cluster_name, "kg")
    assert "kg" not in list_groups(zk, cluster_name)
    assert zk.exists(paths.group("kg")) is None
