"""list_groups and describe_group against a real ZooKeeper with live members."""

from __future__ import annotations

import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import UnknownGroupError, ZooKeeperUnavailableError
from raylog.groups.admin import describe_group, list_groups
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

    rows = describe_group(zk, cluster_name, "g", end_offsets=lambda t, p: ends[(t, p)])
    assert rows == [
        {"group": "g", "topic": "t", "partition": 0, "owner": "a", "committed": 100,
         "members": ["a", "b"], "end_offset": 150, "lag": 50},
        {"group": "g", "topic": "t", "partition": 1, "owner": "a", "committed": None,
         "members": ["a", "b"], "end_offset": 10, "lag": None},
        {"group": "g", "topic": "t", "partition": 2, "owner": "b", "committed": None,
         "members": ["a", "b"], "end_offset": 0, "lag": None},
        {"group": "g", "topic": "t", "partition": 3, "owner": "b", "committed": 300,
         "members": ["a", "b"], "end_offset": 300, "lag": 0},
    ]
    # without end offsets there are no end_offset/lag columns
    assert "lag" not in describe_group(zk, cluster_name, "g")[0]


def test_describe_group_lists_idle_members(zk, registry, cluster_name, join):
    registry.create_topic("t", TopicConfig(partitions=1))
    join("g", ["t"], "a")
    b = join("g", ["t"], "b")
    wait_until(lambda: b.state is MemberState.STABLE and b.rebalances >= 1, what="b to settle")
    wait_until(lambda: [r["owner"] for r in describe_group(zk, cluster_name, "g")] == ["a", "b"],
               what="a to own the partition and b to idle")
    idle = describe_group(zk, cluster_name, "g")[1]
    assert idle == {"group": "g", "topic": None, "partition": None, "owner": "b",
                    "committed": None, "members": ["a", "b"]}


def test_describe_a_group_with_offsets_only(zk, registry, cluster_name):
    registry.create_topic("t", TopicConfig(partitions=2))
    OffsetStore(zk, cluster_name).commit("old", "t", 1, 42)
    rows = describe_group(zk, cluster_name, "old")
    assert [(r["partition"], r["owner"], r["committed"], r["members"]) for r in rows] == [
        (0, None, None, []),
        (1, None, 42, []),
    ]


def test_describe_keeps_offsets_of_a_deleted_topic(zk, cluster_name):
    OffsetStore(zk, cluster_name).commit("g", "gone", 3, 7)
    rows = describe_group(zk, cluster_name, "g")
    assert [(r["topic"], r["partition"], r["committed"]) for r in rows] == [("gone", 3, 7)]


def test_admin_calls_fail_fast_without_zookeeper(make_zk, cluster_name):
    client = make_zk()
    client.stop()
    with pytest.raises(ZooKeeperUnavailableError):
        list_groups(client, cluster_name)
    with pytest.raises(ZooKeeperUnavailableError):
        describe_group(client, cluster_name, "g")
