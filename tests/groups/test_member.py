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
from raylog.groups.member import GroupMember
from raylog.groups.states import MemberState
from raylog.groups.assignment import range_assignment
from raylog.errors import PartitionNotAssignedError
from raylog.testing.faults import drop_connection, expire_session
from raylog.zk.paths import Paths
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
        if m.state is not MemberState.STABLE or m.assignment != mine:
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
    assert data == b'{"topics": ["t"], "assignors": ["range"]}'


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
    assert member.state is MemberState.STABLE
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


def test_a_slow_peer_blocks_one_claim_and_the_member_keeps_trying_with_the_rest_flowing(
    zk, make_zk, cluster_name, topic, members, owner_watcher
):
    # A foreign session holds partition 0's owner node (a slow peer, or one
    # whose session has not expired yet). The member does not fail: it hands
    # out the rest at once and keeps retrying (jittered) until 0 is free.
    squatter = make_zk()
    squatter.create(Paths(cluster_name).owner("g", "t", 0), b"squatter", ephemeral=True, makepath=True)
    made = []
    with owner_watcher(cluster_name, "g", ["t"], lambda: made):
        member = members(start=False, retry=RetryPolicy(max_tries=1000, delay_s=0.05, max_delay_s=0.2,
                                                        jitter=0.5, deadline_s=None), warn_after_s=0.5)
        made.append(member)
        member.start(timeout_s=WAIT_S)
        rest = frozenset(("t", p) for p in range(1, 8))
        wait_until(lambda: member.assignment == rest, what="the unblocked partitions")
        time.sleep(1.0)  # several retries later: still a member, still trying
        assert member.state is MemberState.REBALANCING
        assert member.assignment == rest
        assert owners(zk, cluster_name, "g", "t")[0] == "squatter"
        squatter.stop()  # the peer lets go: its session ends
        wait_until(lambda: member.assignment == rest | {("t", 0)}, what="partition 0 after the peer left")
        assert member.state is MemberState.STABLE


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


def test_a_dropped_connection_hides_the_assignment_and_keeps_the_partitions(zk, cluster_name, topic, members):
    calls = []
    member = members(on_revoked=lambda p: calls.append(("revoked", p)),
                     on_assigned=lambda p: calls.append(("assigned", p)), start=False)
    member.start(timeout_s=WAIT_S)
    everything = frozenset(("t", p) for p in range(8))
    assert member.assignment == everything
    before = {p: zk.exists(Paths(cluster_name).owner("g", "t", p)).czxid for p in range(8)}
    seen = []

    def listener(state):  # kazoo's listeners run in no fixed order
        if state != "CONNECTED":
            seen.append((state, member.assignment))

    member.zk.add_listener(listener)
    drop_connection(member.zk)
    member.zk.remove_listener(listener)
    # At the instant the connection dropped, nothing was handed out ...
    assert seen and seen[0][0] == "SUSPENDED" and seen[0][1] == frozenset()
    wait_until(lambda: member.assignment == everything, what="the member to recover")
    # ... and afterwards the same session still owns the same nodes: no revoke, no replay.
    assert {p: zk.exists(Paths(cluster_name).owner("g", "t", p)).czxid for p in range(8)} == before
    assert calls == [("assigned", everything)]


def test_zookeeper_down_commit_raises_unavailable_and_the_member_recovers(make_zk, cluster_name):
    from raylog.zk.registry import Registry
    from raylog.zk.server import EmbeddedZooKeeper

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
    wait_until(lambda: member.assignment == everything, what="the retried assignment")
    assert calls == [("assigned", everything), ("revoked", everything), ("assigned", everything)]


def test_an_on_assigned_that_keeps_failing_never_holds_partitions_unread(zk, cluster_name, topic, members):
    calls = []

    def assigned(parts):
        calls.append("assigned")
        raise RuntimeError("broker unreachable")

    def revoked(parts):
        calls.append("revoked")

    member = members(start=False, on_assigned=assigned, on_revoked=revoked)
    member.start(timeout_s=1)
    wait_until(lambda: calls.count("assigned") >= 3, what="several tries")
    member.close()
    # every handed-out set was taken back, the member never gave up for good,
    # and nothing is left owned
    assert calls.count("assigned") == calls.count("revoked")
    assert calls[:4] == ["assigned", "revoked", "assigned", "revoked"]
    assert owners(zk, cluster_name, "g", "t") == {}


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
    calls = []
    a = members(on_assigned=lambda p: calls.append(("assigned", p)), on_revoked=lambda p: calls.append(("revoked", p)))
    rebalances = a.rebalances
    node = Paths(cluster_name).topic("t")
    for retention_ms in range(1000, 1020):  # a burst of unrelated setting changes
        zk.set(node, TopicConfig(partitions=8, retention_ms=retention_ms).to_json())
    time.sleep(1.0)
    assert a.rebalances == rebalances
    zk.set(node, TopicConfig(partitions=9).to_json())  # then one that matters
    wait_until(lambda: a.assignment == frozenset(("t", p) for p in range(9)), what="the ninth partition")
    # cooperative: the eight it had were never revoked
    assert calls == [("assigned", frozenset(("t", p) for p in range(8))), ("assigned", frozenset({("t", 8)}))]


def test_start_without_zookeeper_raises_unavailable(make_zk, cluster_name):
    client = make_zk()
    client.stop()
    member = GroupMember(client, cluster_name, "g", ["t"])
    with pytest.raises(ZooKeeperUnavailableError, match="join group"):
        member.start(timeout_s=5)
    assert member.state is MemberState.CLOSED
    member.close()  # harmless


# ------------------------------------------------ ownership that reconciles


def test_a_session_expiring_while_on_revoked_runs_deletes_no_node_another_member_claimed(
    zk, cluster_name, topic, members, owner_watcher
):
    made = []
    expired = threading.Event()
    box = []
    b_nodes = {}

    def slow_revoke(parts):
        # The session expires while the application is still revoking: the
        # other member takes the partitions meanwhile; the release that
        # follows must not delete its nodes.
        if not expired.is_set():
            expired.set()
            expire_session(box[0].zk)
            wait_until(lambda: set(owners(zk, cluster_name, "g", "t")) >= set(range(4, 8)),
                       what="b to claim 4..7 after a's session expired")
            b_nodes.update({p: zk.exists(Paths(cluster_name).owner("g", "t", p)).czxid for p in range(4, 8)})

    with owner_watcher(cluster_name, "g", ["t"], lambda: made):
        a = members(consumer_id="a", on_revoked=slow_revoke, start=False)
        box.append(a)
        made.append(a)
        a.start(timeout_s=WAIT_S)
        b = members(consumer_id="b", start=False)
        made.append(b)
        b.start(timeout_s=1)
        assert expired.wait(WAIT_S)
        wait_settled(zk, cluster_name, "g", topic, [a, b], 8)
        time.sleep(1.0)  # a's late release and rejoin have had time to run
        # the nodes b created right after the expiry were never deleted
        assert {p: zk.exists(Paths(cluster_name).owner("g", "t", p)).czxid for p in range(4, 8)} == b_nodes
        assert owners(zk, cluster_name, "g", "t") == {**{p: "a" for p in range(4)}, **{p: "b" for p in range(4, 8)}}


def test_a_connection_dropped_mid_claim_leaves_no_stray_owner_node(zk, cluster_name, topic, members, owner_watcher):
    member = members(consumer_id="m", start=False)
    creates = []
    real_create = member.zk.create_async

    def create_then_drop(path, *args, **kw):
        result = real_create(path, *args, **kw)
        if "/owners/" in path:
            creates.append(path)
            if len(creates) == 3:  # the connection breaks in the middle of the claims
                drop_connection(member.zk, wait_reconnect=False)
        return result

    member.zk.create_async = create_then_drop
    with owner_watcher(cluster_name, "g", ["t"], lambda: [member]):
        member.start(timeout_s=1)
        everything = frozenset(("t", p) for p in range(8))
        wait_until(lambda: member.assignment == everything, what="the member to hold everything")
        assert len(creates) > 8  # the interrupted claim was tried again
        assert member.owned == everything
        assert owners(zk, cluster_name, "g", "t") == {p: "m" for p in range(8)}
        member.close()
    # whatever the interrupted claim created was reconciled and released
    assert owners(zk, cluster_name, "g", "t") == {}


def test_two_members_never_share_a_session(make_zk, cluster_name, topic, members):
    client = make_zk(timeout=SESSION_S)
    first = members(client=client)
    second = members(client=client, start=False)
    with pytest.raises(ConfigError, match="own client"):
        second.start(timeout_s=5)
    first.close()
    third = members(client=client)  # free again once the first left
    assert third.assignment == frozenset(("t", p) for p in range(8))


def test_every_state_change_of_a_member_is_a_step_of_the_table(zk, cluster_name, topic, members, monkeypatch):
    """Start, leave, and a close before start: each change the member makes
    is recorded by the table's function, (CLOSING, LEFT) included."""
    from raylog.groups import member as member_module, states

    steps = []

    def recording(state, event):
        step = states.transition(state, event)
        steps.append((state, event, step.state))
        return step

    monkeypatch.setattr(member_module, "transition", recording)
    member = members()
    member.close()
    assert member.state is MemberState.CLOSED
    assert steps[-1] == (MemberState.CLOSING, states.Event.LEFT, MemberState.CLOSED)
    assert (MemberState.CREATED, states.Event.START, MemberState.JOINING) in steps
    never_started = members(start=False)
    never_started.close()
    assert never_started.state is MemberState.CLOSED
    assert steps[-1] == (MemberState.CREATED, states.Event.CLOSE, MemberState.CLOSED)
