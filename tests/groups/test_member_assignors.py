"""Group members choosing an assignor through their ids nodes, against a real
ZooKeeper (docs/design.md §4): the option is written into ``ids/<id>``, the
group applies the first assignor every member supports, a member of an older
version (no list) supports ``range`` only, and ``sticky`` keeps the owner
node of every partition that stays where it is.

Every check reads the owner nodes in ZooKeeper. Waits are bounded polls.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import AssignorError, ConfigError
from raylog.groups import assignors
from raylog.groups.assignment import parse_assignors, range_assignment
from raylog.groups.member import GroupMember
from raylog.groups.states import MemberState
from raylog.zk.paths import Paths

SESSION_S = 3.0
WAIT_S = 60.0
PARTITIONS = 8
ALL = frozenset(("t", p) for p in range(PARTITIONS))


def wait_until(predicate, timeout_s: float = WAIT_S, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def owner_nodes(zk, cluster, group="g", topic="t") -> dict[tuple[str, int], tuple[str, int]]:
    """``{(topic, p): (holder id, creation zxid)}`` of the owner nodes."""
    paths = Paths(cluster)
    out = {}
    if not zk.exists(paths.owners(group, topic)):
        return out
    for name in zk.get_children(paths.owners(group, topic)):
        try:
            data, stat = zk.get(paths.owner(group, topic, int(name)))
        except Exception:  # noqa: BLE001 - deleted between the two reads
            continue
        out[(topic, int(name))] = (data.decode(), stat.czxid)
    return out


def member_infos(zk, cluster, group="g") -> list[assignors.MemberInfo]:
    """The members as their ids nodes show them (what every member reads)."""
    paths = Paths(cluster)
    infos = []
    for m in zk.get_children(paths.ids(group)):
        data, stat = zk.get(paths.member(group, m))
        infos.append(assignors.MemberInfo(m, frozenset(json.loads(data)["topics"]), parse_assignors(data),
                                          stat.czxid))
    return infos


def settled(zk, cluster, members, name: str) -> dict | None:
    """The owner nodes once every member is STABLE, applied ``name``, hands
    out exactly what it owns in ZooKeeper, and the owners are what ``name``
    computes from the ids nodes (and, for sticky, from those owners)."""
    infos = member_infos(zk, cluster)
    nodes = owner_nodes(zk, cluster)
    holders = {tp: h for tp, (h, _) in nodes.items()}
    want = assignors.assign(assignors.BUILTIN[name], infos, {"t": PARTITIONS}, holders)
    if {tp: m for m, parts in want.items() for tp in parts} != holders:
        return None
    for m in members:
        if m.state is not MemberState.STABLE or m.assignor != name:
            return None
        if m.assignment != want.get(m.consumer_id, frozenset()):
            return None
    return nodes


def wait_settled(zk, cluster, members, name):
    return wait_until(lambda: settled(zk, cluster, members, name),
                      what=f"{len(members)} members to settle with {name}")


@pytest.fixture
def topic(registry):
    registry.create_topic("t", TopicConfig(partitions=PARTITIONS))
    return "t"


class Recorder:
    """A member's callbacks, recorded."""

    def __init__(self):
        self.revoked: list[frozenset] = []
        self.assigned: list[frozenset] = []

    def all_revoked(self) -> frozenset:
        return frozenset().union(*self.revoked) if self.revoked else frozenset()


@pytest.fixture
def members(make_zk, cluster_name):
    made = []

    def make(strategy, *, consumer_id=None, group="g", topics=("t",)):
        rec = Recorder()
        member = GroupMember(make_zk(timeout=SESSION_S), cluster_name, group, list(topics),
                             consumer_id=consumer_id, assignors=strategy,
                             on_assigned=rec.assigned.append, on_revoked=rec.revoked.append, settle_s=0.1)
        member.recorder = rec
        made.append(member)
        member.start(timeout_s=WAIT_S)
        return member

    yield make
    for member in made:
        member.close()


# -- bad input first --------------------------------------------------------------


def test_an_unknown_assignor_is_refused_before_joining_and_the_group_keeps_its_partitions(
        zk, cluster_name, topic, members, make_zk):
    first = members(["sticky", "range"], consumer_id="first")
    wait_settled(zk, cluster_name, [first], "sticky")
    before = owner_nodes(zk, cluster_name)
    for option in ("cooperative-sticky", ["sticky", "roundrobin"], [], ["range", "range"]):
        with pytest.raises(AssignorError) as err:
            GroupMember(make_zk(timeout=SESSION_S), cluster_name, "g", ["t"], consumer_id="typo", assignors=option)
        assert isinstance(err.value, ConfigError)
    assert "known names: range, round_robin, sticky" in str(
        pytest.raises(AssignorError, GroupMember, zk, cluster_name, "g", ["t"], assignors="roundrobin").value)
    # nothing joined; the member that did keeps every partition, under the same owner nodes
    assert zk.get_children(Paths(cluster_name).ids("g")) == ["first"]
    assert owner_nodes(zk, cluster_name) == before and first.assignment == ALL
    assert first.recorder.revoked == []


# -- the ids node and the choice ---------------------------------------------------


def test_the_ids_node_lists_the_assignors_most_preferred_first(zk, cluster_name, topic, members):
    member = members("sticky,round_robin", consumer_id="m")
    data, _ = zk.get(Paths(cluster_name).member("g", "m"))
    assert json.loads(data) == {"topics": ["t"], "assignors": ["sticky", "round_robin"]}
    assert parse_assignors(data) == ("sticky", "round_robin")
    wait_settled(zk, cluster_name, [member], "sticky")


def test_members_listing_different_preferences_agree_on_the_first_common_one(zk, cluster_name, topic, members):
    a = members(["sticky", "round_robin", "range"], consumer_id="a")
    b = members(["round_robin", "sticky"], consumer_id="b")
    # both list sticky and round_robin; the oldest member (a) prefers sticky
    wait_settled(zk, cluster_name, [a, b], "sticky")
    # c supports round_robin and range: the first of a's list every member supports is round_robin
    c = members(["round_robin", "range"], consumer_id="c")
    nodes = wait_settled(zk, cluster_name, [a, b, c], "round_robin")
    assert {tp: h for tp, (h, _) in nodes.items()} == {("t", p): "abc"[p % 3] for p in range(PARTITIONS)}
    # c leaves: a and b go back to sticky
    c.close()
    wait_settled(zk, cluster_name, [a, b], "sticky")


def test_a_member_of_an_older_version_counts_as_supporting_range_only(zk, cluster_name, topic, members, make_zk):
    a = members("sticky", consumer_id="a")
    wait_settled(zk, cluster_name, [a], "sticky")
    # an older raylog wrote only its topics (and claims its range share itself)
    legacy = make_zk(timeout=SESSION_S)
    paths = Paths(cluster_name)
    legacy.create(paths.member("g", "old"), b'{"topics": ["t"]}', ephemeral=True)
    b = members(["sticky", "round_robin"], consumer_id="b")
    want = range_assignment({"t": PARTITIONS}, {"a": ["t"], "b": ["t"], "old": ["t"]})

    def on_range():
        held = {tp: h for tp, (h, _) in owner_nodes(zk, cluster_name).items()}
        return (a.assignor == b.assignor == "range" and held == {tp: m for m in ("a", "b") for tp in want[m]}
                and a.assignment == want["a"] and b.assignment == want["b"])

    wait_until(on_range, what="range with the legacy member")
    # the legacy member leaves: the two newer ones agree on sticky again
    legacy.delete(paths.member("g", "old"))
    wait_settled(zk, cluster_name, [a, b], "sticky")


# -- sticky keeps what stays ----------------------------------------------------------


def test_sticky_keeps_the_owner_node_of_every_partition_that_stays(zk, cluster_name, topic, members, owner_watcher):
    group: list = []
    with owner_watcher(cluster_name, "g", ["t"], lambda: list(group)):
        group += [members("sticky", consumer_id=f"m{i}") for i in range(3)]
        before = wait_settled(zk, cluster_name, group, "sticky")
        assert sorted(len(m.assignment) for m in group) == [2, 3, 3]
        for m in group:
            m.recorder.revoked.clear()

        # a fourth joins: it takes its 2 partitions from the members with 3; nothing else moves
        group.append(members("sticky", consumer_id="m3"))
        after = wait_settled(zk, cluster_name, group, "sticky")
        stayed = {tp for tp in before if after[tp][0] == before[tp][0]}
        assert len(stayed) == PARTITIONS - 2 and len(group[3].assignment) == 2
        for tp in stayed:
            assert after[tp][1] == before[tp][1], f"{tp} was released and claimed again"
        assert frozenset().union(*(m.recorder.all_revoked() for m in group)) == ALL - stayed
        for m in group:
            m.recorder.revoked.clear()

        # the oldest leaves: only its partitions move
        leaver = group.pop(0)
        gone = leaver.assignment
        leaver.close()
        final = wait_settled(zk, cluster_name, group, "sticky")
        for tp, (holder, czxid) in after.items():
            if tp not in gone:
                assert final[tp] == (holder, czxid), f"{tp} moved although its owner stayed"
        assert all(m.recorder.revoked == [] for m in group)
        assert sorted(len(m.assignment) for m in group) == [2, 3, 3]


def test_sticky_members_started_at_once_converge_with_one_owner_per_partition(
        zk, cluster_name, topic, make_zk, owner_watcher):
    """Members that read owners/ at different moments of overlapping
    rebalances still end up agreeing (each step is done only at the fixpoint)."""
    group: list = []
    lock = threading.Lock()

    def join(i):
        member = GroupMember(make_zk(timeout=SESSION_S), cluster_name, "g", ["t"], consumer_id=f"s{i}",
                             assignors="sticky", settle_s=0.05)
        with lock:
            group.append(member)
        member.start(timeout_s=WAIT_S)

    try:
        with owner_watcher(cluster_name, "g", ["t"], lambda: list(group)):
            threads = [threading.Thread(target=join, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT_S)
            wait_settled(zk, cluster_name, group, "sticky")
            assert sorted(len(m.assignment) for m in group) == [1, 1, 1, 1, 2, 2]
            # two leave at once, two more join
            for m in group[:2]:
                m.close()
            del group[:2]
            threads = [threading.Thread(target=join, args=(i,)) for i in (6, 7)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT_S)
            wait_settled(zk, cluster_name, group, "sticky")
            assert frozenset().union(*(m.assignment for m in group)) == ALL
    finally:
        for m in group:
            m.close()


class Reversed:
    """A user's assignor: contiguous ranges with the members in reverse id order."""

    name = "reversed_range"

    def assign(self, members, partition_counts, owners):
        order = sorted((m.id for m in members), reverse=True)
        ranges = range_assignment(
            partition_counts, {f"{i:03d}": next(m.topics for m in members if m.id == mid) for i, mid in enumerate(order)})
        return {mid: ranges[f"{i:03d}"] for i, mid in enumerate(order)}


def test_a_users_assignor_listed_by_every_member_is_applied(zk, cluster_name, topic, members):
    a = members([Reversed(), "range"], consumer_id="a")
    b = members([Reversed, "sticky", "range"], consumer_id="b")  # a class will do
    half = frozenset(("t", p) for p in range(PARTITIONS // 2))
    wait_until(lambda: a.assignor == b.assignor == "reversed_range" and b.assignment == half
               and a.assignment == ALL - half
               and {tp: h for tp, (h, _) in owner_nodes(zk, cluster_name).items()}
               == {**{tp: "b" for tp in half}, **{tp: "a" for tp in ALL - half}},
               what="the user's assignor applied")
