"""list_groups and describe_group against a real ZooKeeper with live members."""

from __future__ import annotations

import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import ConfigError, GroupActiveError, UnknownGroupError, ZooKeeperUnavailableError
from raylog.groups.admin import (
    delete_group,
    delete_group_offsets,
    delete_topic_offsets,
    describe_group,
    list_groups,
    reset_offsets,
)
from raylog.groups.member import GroupMember
from raylog.groups.states import MemberState
from raylog.groups.offsets import OffsetStore

SESSION_S = 3.0


def wait_until(predicate, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def join(make_zk, cluster_name):
    made = []

    def join(group, topics, consumer_id):
        member = GroupMember(make_zk(timeout=SESSION_S), cluster_name, group, topics, consumer_id=consumer_id)
        made.append(member)
        member.start(timeout_s=60)
        return member

    yield join
    for member in made:
        member.close()


def test_no_groups_in_a_new_cluster(zk, cluster_name):
    assert list_groups(zk, cluster_name) == []


def test_list_groups_shows_groups_with_members_or_offsets(zk, registry, cluster_name, join):
    registry.create_topic("t", TopicConfig(partitions=2))
    join("live", ["t"], "c1")
    OffsetStore(zk, cluster_name).commit("finished", "t", 0, 10)
    assert list_groups(zk, cluster_name) == ["finished", "live"]


def test_a_group_whose_members_left_without_offsets_is_not_listed(zk, registry, cluster_name, join):
    registry.create_topic("t", TopicConfig(partitions=2))
    join("brief", ["t"], "c1").close()
    assert list_groups(zk, cluster_name) == []
    with pytest.raises(UnknownGroupError, match="'brief'"):
        describe_group(zk, cluster_name, "brief")


def test_describe_an_unknown_group_raises(zk, cluster_name):
    with pytest.raises(UnknownGroupError, match="list_groups"):
        describe_group(zk, cluster_name, "nobody")


def test_describe_group_shows_owners_offsets_and_lag(zk, registry, cluster_name, join):
    registry.create_topic("t", TopicConfig(partitions=4))
    a = join("g", ["t"], "a")
    b = join("g", ["t"], "b")
    wait_until(lambda: a.state is MemberState.STABLE and b.state is MemberState.STABLE
               and len(a.assignment) == 2 and len(b.assignment) == 2, what="the split")
    a.commit({("t", 0): 100})
    b.commit({("t", 3): 300})
    ends = {("t", 0): 150, ("t", 1): 10, ("t", 2): 0, ("t", 3): 300}

    sizes = {("t", 0): 25.0, ("t", 1): None, ("t", 2): None, ("t", 3): 30.0}
    counted = {("t", 0): 3, ("t", 1): None, ("t", 2): None, ("t", 3): 0}
    rows = describe_group(zk, cluster_name, "g", lambda t, p, c: (ends[(t, p)], sizes[(t, p)], counted[(t, p)]))
    common = {"group": "g", "topic": "t", "topic_exists": True, "members": ["a", "b"]}
    assert rows == [
        {**common, "partition": 0, "owner": "a", "committed": 100, "end_offset": 150, "lag_bytes": 50,
         "lag_messages": 3, "lag_messages_estimate": 2},
        {**common, "partition": 1, "owner": "a", "committed": None, "end_offset": 10, "lag_bytes": None,
         "lag_messages": None, "lag_messages_estimate": None},
        {**common, "partition": 2, "owner": "b", "committed": None, "end_offset": 0, "lag_bytes": None,
         "lag_messages": None, "lag_messages_estimate": None},
        {**common, "partition": 3, "owner": "b", "committed": 300, "end_offset": 300, "lag_bytes": 0,
         "lag_messages": 0, "lag_messages_estimate": 0},
    ]
    # without partition info there are no end_offset/lag columns
    assert "lag_bytes" not in describe_group(zk, cluster_name, "g")[0]


def test_lag_is_not_clamped_and_slow_partitions_share_one_short_deadline(zk, registry, cluster_name):
    registry.create_topic("t", TopicConfig(partitions=6))
    store = OffsetStore(zk, cluster_name)
    for p in range(6):
        store.commit("g", "t", p, 500)

    def info(topic, partition, committed):
        if partition % 2:
            time.sleep(30)  # an unreachable partition
        return 400, 10.0, None

    started = time.monotonic()
    rows = describe_group(zk, cluster_name, "g", info, timeout_s=1.0)
    assert time.monotonic() - started < 15  # one deadline for all, not one per partition
    assert [r["lag_bytes"] for r in rows] == [-100, None, -100, None, -100, None]
    assert [r["end_offset"] for r in rows] == [400, None, 400, None, 400, None]


def test_describe_group_lists_idle_members(zk, registry, cluster_name, join):
    registry.create_topic("t", TopicConfig(partitions=1))
    join("g", ["t"], "a")
    b = join("g", ["t"], "b")
    wait_until(lambda: b.state is MemberState.STABLE and b.rebalances >= 1, what="b to settle")
    wait_until(lambda: [r["owner"] for r in describe_group(zk, cluster_name, "g")] == ["a", "b"],
               what="a to own the partition and b to idle")
    idle = describe_group(zk, cluster_name, "g")[1]
    assert idle == {"group": "g", "topic": None, "partition": None, "topic_exists": None, "owner": "b",
                    "committed": None, "members": ["a", "b"]}


def test_describe_a_group_with_offsets_only(zk, registry, cluster_name):
    registry.create_topic("t", TopicConfig(partitions=2))
    OffsetStore(zk, cluster_name).commit("old", "t", 1, 42)
    rows = describe_group(zk, cluster_name, "old")
    assert [(r["partition"], r["owner"], r["committed"], r["members"]) for r in rows] == [
        (0, None, None, []),
        (1, None, 42, []),
    ]


def test_describe_keeps_offsets_of_a_deleted_topic(zk, registry, cluster_name):
    registry.create_topic("t", TopicConfig(partitions=1))
    store = OffsetStore(zk, cluster_name)
    store.commit("g", "gone", 3, 7)
    store.commit("g", "t", 0, 5)
    asked = []

    def info(topic, partition, committed):
        asked.append(topic)
        return 9, 1.0, 4

    rows = describe_group(zk, cluster_name, "g", info)
    assert [(r["topic"], r["partition"], r["topic_exists"], r["committed"], r["lag_bytes"]) for r in rows] == [
        ("gone", 3, False, 7, None), ("t", 0, True, 5, 4)]
    assert asked == ["t"]  # the deleted topic's partitions are not asked for


def test_delete_group_is_refused_while_members_live_then_removes_offsets(zk, registry, cluster_name, join):
    registry.create_topic("t", TopicConfig(partitions=2))
    member = join("g", ["t"], "a")
    member.commit({("t", 0): 10})
    with pytest.raises(GroupActiveError, match="live member") as info:
        delete_group(zk, cluster_name, "g")
    assert info.value.retriable
    assert OffsetStore(zk, cluster_name).committed("g", "t", 0) == 10  # nothing lost
    member.close()
    delete_group(zk, cluster_name, "g")
    assert "g" not in list_groups(zk, cluster_name)
    assert OffsetStore(zk, cluster_name).committed("g", "t", 0) is None
    with pytest.raises(UnknownGroupError):
        delete_group(zk, cluster_name, "g")


def test_reset_offsets_is_a_dry_run_by_default_and_refused_while_members_live(zk, registry, cluster_name, join):
    registry.create_topic("t", TopicConfig(partitions=2))
    store = OffsetStore(zk, cluster_name)
    store.commit("g", "t", 0, 100)
    plan = reset_offsets(zk, cluster_name, "g", "t", {0: 0, 1: 40})
    assert [(r["partition"], r["current"], r["new"]) for r in plan] == [(0, 100, 0), (1, None, 40)]
    assert store.committed("g", "t", 0) == 100 and store.committed("g", "t", 1) is None
    reset_offsets(zk, cluster_name, "g", "t", {0: 0, 1: 40}, dry_run=False)
    assert (store.committed("g", "t", 0), store.committed("g", "t", 1)) == (0, 40)
    member = join("g", ["t"], "a")
    with pytest.raises(GroupActiveError):
        reset_offsets(zk, cluster_name, "g", "t", {0: 7}, dry_run=False)
    assert store.committed("g", "t", 0) == 0
    member.close()
    with pytest.raises(ConfigError):
        reset_offsets(zk, cluster_name, "g", "t", {0: -1}, dry_run=False)


def test_delete_group_offsets_is_refused_for_a_topic_a_member_reads_and_deletes_the_others(
        zk, registry, cluster_name, join):
    registry.create_topic("t", TopicConfig(partitions=2))
    registry.create_topic("u", TopicConfig(partitions=1))
    store = OffsetStore(zk, cluster_name)
    member = join("g", ["t"], "a")
    member.commit({("t", 0): 10, ("t", 1): 20})
    store.commit("g", "u", 0, 30)
    # a topic the live member reads: refused as a whole, nothing deleted (not even u's)
    with pytest.raises(GroupActiveError, match="read them") as info:
        delete_group_offsets(zk, cluster_name, "g", {("t", 0), ("u", 0)})
    assert info.value.details["topics"] == ["t"] and info.value.details["members"] == ["a"]
    assert store.committed_all("g") == {("t", 0): 10, ("t", 1): 20, ("u", 0): 30}
    # a topic no member reads: deleted while the member lives; a pair without an offset is no error
    assert delete_group_offsets(zk, cluster_name, "g", [("u", 0), ("u", 5)]) == [("u", 0)]
    assert store.committed_all("g") == {("t", 0): 10, ("t", 1): 20}
    member.close()
    assert delete_group_offsets(zk, cluster_name, "g", {("t", 1)}) == [("t", 1)]
    assert store.committed_all("g") == {("t", 0): 10}
    assert list_groups(zk, cluster_name) == ["g"]
    for bad in ([("t", -1)], [("t", "0")], [("", 0)], ["t-0"]):
        with pytest.raises(ConfigError, match="pair"):
            delete_group_offsets(zk, cluster_name, "g", bad)
    assert store.committed_all("g") == {("t", 0): 10}
    assert delete_group_offsets(zk, cluster_name, "g", {("t", 0)}) == [("t", 0)]
    assert "g" not in list_groups(zk, cluster_name)
    with pytest.raises(UnknownGroupError):
        delete_group_offsets(zk, cluster_name, "g", {("t", 0)})


def test_deleting_a_topic_deletes_every_groups_offsets_of_it(zk, cluster_name):
    store = OffsetStore(zk, cluster_name)
    store.commit("g1", "t", 0, 10)
    store.commit("g2", "t", 1, 20)
    store.commit("g2", "other", 0, 30)
    assert delete_topic_offsets(zk, cluster_name, "t") == ["g1", "g2"]
    assert store.committed_all("g1") == {}
    assert store.committed_all("g2") == {("other", 0): 30}


def test_admin_calls_fail_fast_without_zookeeper(make_zk, cluster_name):
    client = make_zk()
    client.stop()
    with pytest.raises(ZooKeeperUnavailableError):
        list_groups(client, cluster_name)
    with pytest.raises(ZooKeeperUnavailableError):
        describe_group(client, cluster_name, "g")
