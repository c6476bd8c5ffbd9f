"""GroupMember and the decentralized rebalance, against a real ZooKeeper.

Every check of ownership reads the owner nodes in ZooKeeper, not only the
members' own view. Waits are bounded polls; nothing asserts wall-clock speed.
"""

from __future__ import annotations

import threading
import time

import pytest
from kazoo.client import KazooClient

from raylog.config import TopicConfig
from raylog.errors import (
    ClosedError,
    ConfigError,
    NotOwnerError,
    RebalanceError,
    ZooKeeperUnavailableError,
)
from raylog.groups.coordinator import (
    GroupMember,
    MemberState,
    PartitionNotAssignedError,
    range_assignment,
)
from raylog.testing.faults import drop_connection, expire_session
from raylog.groups.paths import Paths
from raylog.retry import RetryPolicy

#: short sessions keep fault tests quick
SESSION_S = 3.0
WAIT_S = 60.0


# ---------------------------------------------------------------- helpers


def wait_until(predicate, timeout_s: float = WAIT_S, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def owners(zk, cluster, group, topic) -> dict[int, str]:
    """``{partition: consumer id}`` from the owner nodes in ZooKeeper."""
    paths = Paths(cluster)
    result = {}
    if not zk.exists(paths.owners(group, topic)):
        return result
    for name in zk.get_children(paths.owners(group, topic)):
        try:
            data, _ = zk.get(paths.owner(group, topic, int(name)))
        except Exception:  # noqa: BLE001 - deleted between the two reads
            continue
        result[int(name)] = data.decode()
    return result


def expected_owners(member_ids, partitions: int, topic: str = "t") -> dict[int, str]:
    assignment = range_assignment({topic: partitions}, {m: [topic] for m in member_ids})
    return {p: m for m, tps in assignment.items() for (_, p) in tps}


def settled(zk, cluster, group, topic, members, partitions) -> bool:
    """Owner nodes match the range assignment of ``members`` and every
    member shows exactly its share."""
    want = expected_owners([m.consumer_id for m in members], partitions, topic)
    if owners(zk, cluster, group, topic) != want:
        return False
    for m in members:
        mine = frozenset((topic, p) for p, owner in want.items() if owner == m.consumer_id)
        if m.state is not MemberState.FETCHING or m.assignment != mine:
            return False
    return True


def wait_settled(zk, cluster, group, topic, members, partitions):
    wait_until(lambda: settled(zk, cluster, group, topic, members, partitions),
               what=f"{len(members)} members to settle on {partitions} partitions")


@pytest.fixture
def topic(registry):
    registry.create_topic("t", TopicConfig(partitions=8))
    return "t"


@pytest.fixture
def members(make_zk, cluster_name):
    """A factory of started-or-not members, each on its own short session;
    all of them are closed after the test."""
    made = []

    def make(group="g", topics=("t",), *, start=True, client=None, **kw):
        client = client or make_zk(timeout=SESSION_S)
        member = GroupMember(client, cluster_name, group, list(topics), **kw)
        made.append(member)
        if start:
            member.start(timeout_s=WAIT_S)
        return member

    yield make
    for member in made:
        member.close()


# --------------------------------------------------------- the assignment


@pytest.mark.parametrize(
    "partitions, members, sizes",
    [
        (16, 2, [8, 8]),
        (16, 3, [6, 5, 5]),
        (16, 5, [4, 3, 3, 3, 3]),
        (8, 8, [1] * 8),
        (2, 3, [1, 1, 0]),
        (0, 2, [0, 0]),
    ],
)
def test_range_assignment_gives_contiguous_ranges_in_member_order(partitions, members, sizes):
    ids = [f"c{i}" for i in range(members)]
    result = range_assignment({"t": partitions}, {m: ["t"] for m in reversed(ids)})
    start = 0
    for member, size in zip(ids, sizes):
        assert result[member] == frozenset(("t", p) for p in range(start, start + size))
        start += size
    assert start == partitions


def test_range_assignment_divides_each_topic_among_its_own_subscribers():
    result = range_assignment(
        {"a": 4, "b": 2, "gone": 0},
        {"x": ["a", "b"], "y": ["a"], "z": ["b", "missing"]},
    )
    assert result == {
        "x": frozenset({("a", 0), ("a", 1), ("b", 0)}),
        "y": frozenset({("a", 2), ("a", 3)}),
        "z": frozenset({("b", 1)}),
    }


# ---------------------------------------------------------- membership


def test_members_own_disjoint_partitions_that_cover_the_topic(zk, cluster_name, topic, members):
    group = [members() for _ in range(3)]
    wait_settled(zk, cluster_name, "g", topic, group, 8)
    assignments = [m.assignment for m in group]
    union = frozenset().union(*assignments)
    assert union == frozenset(("t", p) for p in range(8))
    assert sum(len(a) for a in assignments) == 8  # disjoint
    held = owners(zk, cluster_name, "g", topic)
    for m in group:
        assert {("t", p) for p, owner in held.items() if owner == m.consumer_id} == m.assignment
    # the ids nodes hold the subscriptions
    paths = Paths(cluster_name)
    assert sorted(zk.get_children(paths.ids("g"))) == sorted(m.consumer_id for m in group)
    data, _ = zk.get(paths.member("g", group[0].consumer_id))
    assert data == b'{"topics": ["t"]}'


def test_a_join_rebalances_to_the_new_membership(zk, cluster_name, topic, members):
    first = members()
    assert first.assignment == frozenset(("t", p) for p in range(8))
    assert first.generation == 1
    second = members()
    wait_settled(zk, cluster_name, "g", topic, [first, second], 8)
    assert len(first.assignment) == len(second.assignment) == 4
    assert first.generation >= 2


def test_a_leave_rebalances_the_leavers_share_to_the_rest(zk, cluster_name, topic, members):
    group = [members() for _ in range(3)]
    wait_settled(zk, cluster_name, "g", topic, group, 8)
    leaver = group.pop(1)
    leaver.close()
    assert leaver.state is MemberState.CLOSED
    assert leaver.assignment == frozenset()
    assert not zk.exists(Paths(cluster_name).member("g", leaver.consumer_id))
    wait_settled(zk, cluster_name, "g", topic, group, 8)
    assert leaver.consumer_id not in owners(zk, cluster_name, "g", topic).values()


def test_two_groups_each_own_the_whole_topic_independently(zk, cluster_name, topic, members):
    a = [members("a") for _ in range(2)]
    b = [members("b")]
    wait_settled(zk, cluster_name, "a", topic, a, 8)
    wait_settled(zk, cluster_name, "b", topic, b, 8)
    generation_b = b[0].generation
    a[0].close()  # a change in group a ...
    wait_settled(zk, cluster_name, "a", topic, a[1:], 8)
    assert b[0].generation == generation_b  # ... does not touch group b
    assert b[0].assignment == frozenset(("t", p) for p in range(8))


def test_members_with_different_subscriptions_share_only_common_topics(zk, registry, cluster_name, members):
    registry.create_topic("a", TopicConfig(partitions=4))
    registry.create_topic("b", TopicConfig(partitions=2))
    x = members(topics=["a", "b"], consumer_id="x")
    y = members(topics=["a"], consumer_id="y")
    want_x = frozenset({("a", 0), ("a", 1), ("b", 0), ("b", 1)})
    wait_until(lambda: x.assignment == want_x and y.assignment == {("a", 2), ("a", 3)},
               what="the split by subscription")
    assert owners(zk, cluster_name, "g", "b") == {0: "x", 1: "x"}


def test_eight_members_started_at_once_converge_without_sharing_a_partition(
    zk, registry, cluster_name, members
):
    registry.create_topic("t", TopicConfig(partitions=16))
    holders: dict[tuple[str, int], str] = {}
    violations: list[str] = []
    lock = threading.Lock()

    def callbacks(name):
        def assigned(parts):
            with lock:
                for tp in parts:
                    if tp in holders:
                        violations.append(f"{name} got {tp} still held by {holders[tp]}")
                    holders[tp] = name

        def revoked(parts):
            with lock:
                for tp in parts:
                    if holders.get(tp) == name:
                        del holders[tp]

        return assigned, revoked

    # Watch the owner nodes during the run: every owner is a member of the group.
    names = [f"m{i}" for i in range(8)]
    seen_owners: set[str] = set()
    paths = Paths(cluster_name)
    zk.ensure_path(paths.owners("g", "t"))

    @zk.ChildrenWatch(paths.owners("g", "t"))
    def _watch_owners(children):
        for name in children:
            try:
                data, _ = zk.get(paths.owner("g", "t", int(name)))
            except Exception:  # noqa: BLE001 - released meanwhile
                continue
            seen_owners.add(data.decode())

    group = []
    for name in names:
        assigned, revoked = callbacks(name)
        group.append(members(start=False, consumer_id=name, on_assigned=assigned, on_revoked=revoked))
    errors = []

    def start(m):
        try:
            m.start(timeout_s=WAIT_S)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=start, args=(m,)) for m in group]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not errors
    wait_settled(zk, cluster_name, "g", "t", group, 16)
    assert not violations
    assert seen_owners <= set(names)
    with lock:
        assert holders == {("t", p): names[p // 2] for p in range(16)}


# ------------------------------------------------------------- offsets


def test_commit_and_committed_round_trip_and_survive_a_member_restart(zk, cluster_name, topic, members):
    member = members(consumer_id="c1")
    member.commit({("t", 0): 100, ("t", 5): 500})
    assert member.committed("t", 0) == 100
    assert member.committed("t", 5) == 500
    assert member.committed("t", 1) is None
    member.close()
    again = members(consumer_id="c1")
    assert again.committed("t", 0) == 100
    assert again.committed("t", 5) == 500


def test_commit_of_a_partition_the_member_does_not_own_is_refused(zk, cluster_name, topic, members):
    a = members(consumer_id="a")
    b = members(consumer_id="b")
    wait_settled(zk, cluster_name, "g", topic, [a, b], 8)
    with pytest.raises(PartitionNotAssignedError, match="does not own t/7") as info:
        a.commit({("t", 0): 1, ("t", 7): 1})
    assert isinstance(info.value, NotOwnerError)
    assert not info.value.retriable
    assert a.committed("t", 0) is None  # nothing of the batch was written


def test_on_revoked_runs_before_the_owner_nodes_are_released(zk, cluster_name, topic, members):
    observed = []
    member_box = []

    def revoked(parts):
        member = member_box[0]
        # The owner nodes are still ours while the callback runs ...
        held = owners(zk, cluster_name, "g", "t")
        observed.append(all(held.get(p) == member.consumer_id for _, p in parts))
        # ... so the commit is accepted and lands.
        member.commit({tp: 40 + tp[1] for tp in parts})

    first = members(consumer_id="a", on_revoked=revoked, start=False)
    member_box.append(first)
    first.start(timeout_s=WAIT_S)
    second = members(consumer_id="b")
    wait_settled(zk, cluster_name, "g", topic, [first, second], 8)
    assert observed and all(observed)
    # b took over 4..7 and reads a's commits from a's on_revoked
    assert [second.committed("t", p) for p in range(4, 8)] == [44, 45, 46, 47]


def test_close_revokes_everything_then_deletes_its_nodes(zk, cluster_name, topic, members):
    revoked = []
    member = members(on_revoked=lambda parts: revoked.append(parts))
    member.close()
    assert revoked == [frozenset(("t", p) for p in range(8))]
    assert owners(zk, cluster_name, "g", "t") == {}
    assert zk.get_children(Paths(cluster_name).ids("g")) == []
    member.close()  # idempotent
    with pytest.raises(ClosedError):
        member.commit({("t", 0): 1})
    with pytest.raises(ClosedError):
        member.check()


# ------------------------------------------------------------- topics


def test_more_partitions_in_the_topic_config_trigger_a_rebalance(zk, cluster_name, topic, members):
    a, b = members(), members()
    wait_settled(zk, cluster_name, "g", topic, [a, b], 8)
    zk.set(Paths(cluster_name).topic("t"), TopicConfig(partitions=12).to_json())
    wait_settled(zk, cluster_name, "g", topic, [a, b], 12)


def test_a_topic_created_after_the_member_started_is_picked_up(zk, registry, cluster_name, members):
    member = members(topics=["later"])
    assert member.assignment == frozenset()
    assert member.state is MemberState.FETCHING
    registry.create_topic("later", TopicConfig(partitions=3))
    wait_until(lambda: member.assignment == frozenset(("later", p) for p in range(3)),
               what="the new topic's partitions")


def test_bad_arguments_are_config_errors(zk, cluster_name):
    with pytest.raises(ConfigError, match="at least one topic"):
        GroupMember(zk, cluster_name, "g", [])
    with pytest.raises(ConfigError, match="list of topic names"):
        GroupMember(zk, cluster_name, "g", "t")
    with pytest.raises(ConfigError, match="group name"):
        GroupMember(zk, cluster_name, "a/b", ["t"])


# ------------------------------------------------------------- faults


def test_claim_retries_exhausted_raise_rebalance_error_and_the_member_leaves(
    zk, make_zk, cluster_name, topic, members
):
    # A foreign session holds partition 0's owner node and never lets go.
    squatter = make_zk()
    squatter.create(Paths(cluster_name).owner("g", "t", 0), b"squatter", ephemeral=True, makepath=True)
    member = members(start=False, retry=RetryPolicy(max_tries=3, delay_s=0.05, deadline_s=2.0))
    with pytest.raises(RebalanceError, match=r"could not claim t/0 \(held by squatter\)") as info:
        member.start(timeout_s=WAIT_S)
    assert info.value.retriable
    assert member.state is MemberState.FAILED
    with pytest.raises(RebalanceError):
        member.assignment
    with pytest.raises(RebalanceError):
        member.check()
    # It left the group rather than sit on a share it cannot read.
    assert zk.get_children(Paths(cluster_name).ids("g")) == []
    assert owners(zk, cluster_name, "g", "t") == {0: "squatter"}


def test_an_expired_session_rejoins_and_no_partition_stays_unowned(zk, cluster_name, topic, members):
    revoked = []
    box = []

    def on_revoked(parts):
        try:
            box[0].commit({tp: 1 for tp in parts})
            revoked.append((parts, None))
        except Exception as err:  # noqa: BLE001 - recorded
            revoked.append((parts, err))

    a = members(consumer_id="a", on_revoked=on_revoked, start=False)
    box.append(a)
    a.start(timeout_s=WAIT_S)
    b = members(consumer_id="b")
    wait_settled(zk, cluster_name, "g", topic, [a, b], 8)
    generation = a.generation
    revoked.clear()
    expire_session(a.zk)
    # told to stop at once, before it rejoins; its commit there is refused
    # as ZooKeeper being unavailable (it may no longer own the partitions)
    wait_until(lambda: revoked, what="on_revoked after the session loss")
    parts, err = revoked[0]
    assert parts == frozenset(("t", p) for p in range(4))
    assert isinstance(err, ZooKeeperUnavailableError)
    wait_until(lambda: a.generation > generation, what="a to rejoin")
    wait_settled(zk, cluster_name, "g", topic, [a, b], 8)
    assert a.zk.exists(Paths(cluster_name).member("g", "a"))


def test_a_dropped_connection_hides_the_assignment_until_it_recovers(zk, cluster_name, topic, members):
    seen_empty = threading.Event()
    box = []

    def revoked(parts):
        if box[0].assignment == frozenset():
            seen_empty.set()

    member = members(on_revoked=revoked, start=False)
    box.append(member)
    member.start(timeout_s=WAIT_S)
    generation = member.generation
    drop_connection(member.zk)
    assert seen_empty.wait(WAIT_S)
    wait_until(lambda: member.generation > generation, what="the member to recover")
    wait_settled(zk, cluster_name, "g", topic, [member], 8)


def test_zookeeper_down_commit_raises_unavailable_and_the_member_recovers(make_zk, cluster_name):
    from raylog.groups.registry import Registry
    from raylog.groups.zookeeper import EmbeddedZooKeeper

    server = EmbeddedZooKeeper()
    member = None
    try:
        server.start()
        admin = make_zk(server.connect_string, timeout=SESSION_S)
        Registry(admin, cluster_name).create_topic("t", TopicConfig(partitions=4))
        client = make_zk(server.connect_string, timeout=SESSION_S)
        member = GroupMember(client, cluster_name, "g", ["t"], consumer_id="m")
        member.start(timeout_s=WAIT_S)
        member.commit({("t", 1): 11})

        server.kill_process()
        wait_until(lambda: member.assignment == frozenset(), what="the assignment to empty")
        with pytest.raises(ZooKeeperUnavailableError, match="ZooKeeper") as info:
            member.commit({("t", 1): 12})
        assert info.value.retriable
        with pytest.raises(ZooKeeperUnavailableError):
            member.committed("t", 1)

        server.start()
        wait_until(lambda: member.assignment == frozenset(("t", p) for p in range(4)),
                   what="the member to recover")
        member.commit({("t", 1): 13})
        assert member.committed("t", 1) == 13
        assert owners(admin, cluster_name, "g", "t") == {p: "m" for p in range(4)}
    finally:
        if member is not None:
            member.close(timeout_s=5)
        server.stop()


def test_an_on_revoked_that_raises_does_not_block_the_rebalance(zk, cluster_name, topic, members):
    def broken(parts):
        raise RuntimeError("consumer bug")

    a = members(on_revoked=broken)
    assert a.assignment == frozenset(("t", p) for p in range(8))
    b = members()
    wait_settled(zk, cluster_name, "g", topic, [a, b], 8)


def test_an_on_assigned_that_fails_once_is_revoked_and_retried(zk, cluster_name, topic, members):
    calls = []

    def assigned(parts):
        calls.append(("assigned", parts))
        if len(calls) == 1:
            raise RuntimeError("offsets not readable yet")

    member = members(on_assigned=assigned, on_revoked=lambda parts: calls.append(("revoked", parts)))
    everything = frozenset(("t", p) for p in range(8))
    assert member.assignment == everything
    assert calls == [("assigned", everything), ("revoked", everything), ("assigned", everything)]
    assert member.generation == 1


def test_an_on_assigned_that_keeps_failing_fails_the_member(zk, cluster_name, topic, members):
    revoked = []

    def assigned(parts):
        raise RuntimeError("broker unreachable")

    member = members(start=False, on_assigned=assigned, on_revoked=revoked.append)
    with pytest.raises(RebalanceError, match="on_assigned failed twice.*broker unreachable") as info:
        member.start(timeout_s=WAIT_S)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert len(revoked) == 2  # every handed-out set was taken back
    assert member.state is MemberState.FAILED
    assert owners(zk, cluster_name, "g", "t") == {}
    assert zk.get_children(Paths(cluster_name).ids("g")) == []


def test_wait_for_assignment_returns_the_settled_share_and_refuses_after_close(
    zk, cluster_name, topic, members
):
    a = members(consumer_id="a")
    b = members(consumer_id="b")
    wait_settled(zk, cluster_name, "g", topic, [a, b], 8)
    assert b.wait_for_assignment(timeout_s=WAIT_S) == frozenset(("t", p) for p in range(4, 8))
    b.close()
    with pytest.raises(ClosedError):
        b.wait_for_assignment(timeout_s=1)
    # (a settles on everything once b's departure reaches it)
    wait_settled(zk, cluster_name, "g", topic, [a], 8)
    assert a.wait_for_assignment(timeout_s=WAIT_S) == frozenset(("t", p) for p in range(8))


def test_a_member_used_as_a_context_manager_joins_and_leaves(make_zk, zk, cluster_name, topic):
    with GroupMember(make_zk(timeout=SESSION_S), cluster_name, "g", ["t"], consumer_id="ctx") as member:
        assert member.assignment == frozenset(("t", p) for p in range(8))
        assert owners(zk, cluster_name, "g", "t") == {p: "ctx" for p in range(8)}
    assert member.state is MemberState.CLOSED
    assert owners(zk, cluster_name, "g", "t") == {}


def test_topic_setting_changes_that_keep_the_partition_count_do_not_rebalance(zk, cluster_name, topic, members):
    a = members()
    generation = a.generation
    node = Paths(cluster_name).topic("t")
    for retention_ms in range(1000, 1020):  # a burst of unrelated setting changes
        zk.set(node, TopicConfig(partitions=8, retention_ms=retention_ms).to_json())
    zk.set(node, TopicConfig(partitions=9).to_json())  # then one that matters
    wait_until(lambda: a.assignment == frozenset(("t", p) for p in range(9)), what="the ninth partition")
    assert a.generation == generation + 1


def test_start_without_zookeeper_raises_unavailable(make_zk, cluster_name):
    client = make_zk()
    client.stop()
    member = GroupMember(client, cluster_name, "g", ["t"])
    with pytest.raises(ZooKeeperUnavailableError, match="join group"):
        member.start(timeout_s=5)
    assert member.state is MemberState.CLOSED
    member.close()  # harmless
