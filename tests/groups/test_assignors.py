"""The pluggable assignors (raylog.groups.assignors), as pure functions.

Every member computes the group's assignment by itself from the same read of
ZooKeeper, so each assignor is held to: every partition of a subscribed topic
has exactly one owner, subscribed to its topic; the answer does not depend on
the order of the inputs; ``sticky`` moves the fewest partitions when a member
joins or leaves, and gives the same answer from any view of owners/ that a
rebalance passes through.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raylog.errors import AssignorError, ConfigError, RaylogError
from raylog.groups.assignment import parse_assignors, range_assignment
from raylog.groups.assignors import (
    BUILTIN,
    MemberInfo,
    RangeAssignor,
    StickyAssignor,
    assign,
    choose,
    resolve,
)

TOPICS = ("a", "b", "c")


def member(i: int, topics=("a",), assignors=("range",), joined=None) -> MemberInfo:
    return MemberInfo(f"m{i:02d}", frozenset(topics), tuple(assignors), i if joined is None else joined)


@st.composite
def groups(draw, max_members=7, max_partitions=24):
    """Members (distinct ids and join order) with subscriptions, and counts."""
    n = draw(st.integers(1, max_members))
    ids = draw(st.lists(st.integers(0, 99), min_size=n, max_size=n, unique=True))
    joined = draw(st.permutations(list(range(n))))
    members = [
        MemberInfo(f"m{i:02d}", frozenset(draw(st.sets(st.sampled_from(TOPICS), min_size=1))), ("range",), j)
        for i, j in zip(ids, joined)
    ]
    counts = {t: draw(st.integers(0, max_partitions)) for t in TOPICS}
    return members, counts


def owners_of(assignment) -> dict:
    return {tp: m for m, parts in assignment.items() for tp in parts}


def check_complete(members, counts, result):
    by_id = {m.id: m for m in members}
    assert set(result) == set(by_id)
    seen = {}
    for m, parts in result.items():
        for topic, p in parts:
            assert topic in by_id[m].topics and 0 <= p < counts[topic]
            assert (topic, p) not in seen
            seen[(topic, p)] = m
    subscribed = {t for m in members for t in m.topics}
    assert set(seen) == {(t, p) for t in subscribed for p in range(counts[t])}


# -- every assignor ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILTIN))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(group=groups(), seed=st.integers(0, 2**32 - 1))
def test_every_partition_has_one_subscribed_owner_whatever_the_input_order(name, group, seed):
    members, counts = group
    rnd = random.Random(seed)
    # a view of owners/ as some earlier rebalance left it (including a member gone since)
    ids = [m.id for m in members] + ["gone"]
    owners = {(t, p): rnd.choice(ids) for t in TOPICS for p in range(counts[t]) if rnd.random() < 0.7}
    result = assign(BUILTIN[name], members, counts, owners)
    check_complete(members, counts, result)
    # each member computes it from its own read: shuffled members, counts and owners
    shuffled = members[:]
    rnd.shuffle(shuffled)
    other_counts = dict(reversed(list(counts.items())))
    other_owners = dict(sorted(owners.items(), key=lambda kv: rnd.random()))
    assert assign(BUILTIN[name], shuffled, other_counts, other_owners) == result


@pytest.mark.parametrize("name", sorted(BUILTIN))
@settings(max_examples=60, deadline=None)
@given(group=groups())
def test_balanced_when_every_member_subscribes_to_the_same_topics(name, group):
    members, counts = group
    members = [m._replace(topics=frozenset(TOPICS)) for m in members]
    result = assign(BUILTIN[name], members, counts)
    for topic in TOPICS:
        sizes = [sum(1 for t, _ in parts if t == topic) for parts in result.values()]
        if name != "round_robin":  # round_robin balances across topics, not within each
            assert max(sizes) - min(sizes) <= 1
    totals = [len(parts) for parts in result.values()]
    if name == "round_robin":
        assert max(totals) - min(totals) <= 1


def test_range_is_the_paper_range_assignment():
    members = [member(i, ("a", "b")) for i in range(3)]
    counts = {"a": 7, "b": 2}
    assert assign(BUILTIN["range"], members, counts) == range_assignment(counts, {m.id: m.topics for m in members})


def test_round_robin_deals_across_topics_like_kafka():
    # Kafka's RoundRobinAssignor example: C0, C1 on t0, t1 with 3 partitions each
    members = [MemberInfo("C0", frozenset({"t0", "t1"})), MemberInfo("C1", frozenset({"t0", "t1"}))]
    result = assign(BUILTIN["round_robin"], members, {"t0": 3, "t1": 3})
    assert result == {
        "C0": frozenset({("t0", 0), ("t0", 2), ("t1", 1)}),
        "C1": frozenset({("t0", 1), ("t1", 0), ("t1", 2)}),
    }
    # a member skips the partitions of topics it does not subscribe to
    members = [MemberInfo("C0", frozenset({"t0"})), MemberInfo("C1", frozenset({"t0", "t1"})),
               MemberInfo("C2", frozenset({"t0", "t1", "t2"}))]
    result = assign(BUILTIN["round_robin"], members, {"t0": 1, "t1": 2, "t2": 3})
    assert result == {
        "C0": frozenset({("t0", 0)}),
        "C1": frozenset({("t1", 0)}),
        "C2": frozenset({("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)}),
    }


# -- sticky ----------------------------------------------------------------------


def fewest_moves(members, counts, before) -> int:
    """The least number of partitions owned by a remaining member that any
    balanced assignment (per topic, sizes differing by at most one) must move:
    the larger quotas go to the members owning the most."""
    total = 0
    for topic in TOPICS:
        subscribed = [m.id for m in members if topic in m.topics]
        if not subscribed:
            continue
        share, extra = divmod(counts[topic], len(subscribed))
        owned = sorted((sum(1 for t, _ in before.get(m, ()) if t == topic) for m in subscribed), reverse=True)
        quotas = [share + 1] * extra + [share] * (len(subscribed) - extra)
        total += sum(o - min(o, q) for o, q in zip(owned, quotas))
    return total


def moved(members, before, after) -> int:
    """Partitions owned by a remaining member before that another owns after."""
    return sum(len(before.get(m.id, frozenset()) - after[m.id]) for m in members)


@settings(max_examples=200, deadline=None)
@given(group=groups(max_members=5), steps=st.lists(st.tuples(st.booleans(), st.integers(0, 99)), max_size=8))
def test_sticky_moves_the_fewest_partitions_when_a_member_joins_or_leaves(group, steps):
    members, counts = group
    sticky = BUILTIN["sticky"]
    current = assign(sticky, members, counts)
    next_id, next_joined = 100, max(m.joined for m in members) + 1
    for join, pick in steps:
        if join or len(members) == 1:
            topics = frozenset(TOPICS[: 1 + pick % len(TOPICS)])
            # any id (sorting anywhere among the others), but the latest to join
            members = members + [MemberInfo(f"m{pick:02d}-{next_id}", topics, ("sticky",), next_joined)]
            next_id, next_joined = next_id + 1, next_joined + 1
        else:
            members = [m for i, m in enumerate(members) if i != pick % len(members)]
        after = assign(sticky, members, counts, owners_of(current))
        check_complete(members, counts, after)
        assert moved(members, current, after) == fewest_moves(members, counts, current)
        current = after


@settings(max_examples=200, deadline=None)
@given(group=groups(), seed=st.integers(0, 2**32 - 1))
def test_sticky_gives_the_same_answer_from_every_view_a_rebalance_passes_through(group, seed):
    """Members read owners/ at different moments: each partition that moves is
    seen with its old owner, with none, or with its new owner."""
    members, counts = group
    rnd = random.Random(seed)
    ids = [m.id for m in members]
    start = {(t, p): rnd.choice(ids + [None]) for t in TOPICS for p in range(counts[t])}
    start = {tp: m for tp, m in start.items() if m is not None}
    sticky = BUILTIN["sticky"]
    target = assign(sticky, members, counts, start)
    target_owner = owners_of(target)
    for _ in range(5):
        view = {}
        for tp, new in target_owner.items():
            old = start.get(tp)
            stage = rnd.choice((0, 1, 2)) if old != new else 0
            if stage == 0 and old is not None:
                view[tp] = old
            elif stage == 2:
                view[tp] = new
        assert assign(sticky, members, counts, view) == target
    # and once the group holds the target, the target is what it computes
    assert assign(sticky, members, counts, target_owner) == target


def test_sticky_gives_the_extra_partition_to_the_oldest_members():
    members = [member(1, joined=5), member(2, joined=1), member(3, joined=9)]
    result = assign(BUILTIN["sticky"], members, {"a": 5})
    assert result == {"m02": frozenset({("a", 0), ("a", 1)}), "m01": frozenset({("a", 2), ("a", 3)}),
                      "m03": frozenset({("a", 4)})}
    # a newcomer takes only its share, from the ones with most
    joined = members + [member(4, joined=10)]
    after = assign(BUILTIN["sticky"], joined, {"a": 5}, owners_of(result))
    assert after == {"m02": frozenset({("a", 0), ("a", 1)}), "m01": frozenset({("a", 2)}),
                     "m03": frozenset({("a", 4)}), "m04": frozenset({("a", 3)})}
    assert moved(joined, result, after) == 1


class Reverse:
    """A user's assignor: range with the members in reverse id order."""

    name = "reverse"

    def assign(self, members, partition_counts, owners):
        renamed = {m.id: m.topics for m in members}
        order = sorted(renamed, reverse=True)
        result = range_assignment(partition_counts, {f"{i:04d}": renamed[m] for i, m in enumerate(order)})
        return {m: result[f"{i:04d}"] for i, m in enumerate(order)}


# -- choosing and naming -----------------------------------------------------------


def test_the_group_applies_the_first_assignor_every_member_supports_in_the_oldest_members_order():
    old = member(1, assignors=("sticky", "round_robin", "range"), joined=1)
    young = member(2, assignors=("round_robin", "sticky"), joined=2)
    assert choose([young, old]) == "sticky"
    assert choose([young._replace(joined=0), old]) == "round_robin"
    assert choose([old, member(3, assignors=("round_robin", "range"), joined=3)]) == "round_robin"
    # a member of an older version lists nothing: it supports range only
    legacy = member(4, assignors=parse_assignors(b'{"topics": ["a"]}'), joined=4)
    assert legacy.assignors == ("range",)
    assert choose([old, young, legacy]) == "range"
    # nothing in common: range, which every member computes
    assert choose([member(5, assignors=("sticky",)), member(6, assignors=("round_robin",))]) == "range"
    assert choose([]) == "range"


def test_parse_assignors_of_ids_nodes():
    assert parse_assignors(b'{"topics": ["a"], "assignors": ["sticky", "range"]}') == ("sticky", "range")
    for data in (b'{"topics": ["a"]}', b"not json", None, b'{"assignors": []}', b'{"assignors": [1]}', b"[]"):
        assert parse_assignors(data) == ("range",)


def test_resolve_names_lists_and_user_assignors():
    assert resolve(None) == (BUILTIN["range"],)
    assert resolve("sticky") == (BUILTIN["sticky"],)
    assert resolve("sticky, range") == (BUILTIN["sticky"], BUILTIN["range"])
    assert resolve(["round_robin", "range"]) == (BUILTIN["round_robin"], BUILTIN["range"])
    mine = Reverse()
    assert resolve([mine, "range"]) == (mine, BUILTIN["range"])
    assert resolve(mine) == (mine,)
    assert [a.name for a in resolve([Reverse, StickyAssignor])] == ["reverse", "sticky"]  # classes, as kafka-python
    assert resolve([BUILTIN["range"]]) == resolve([RangeAssignor()]) == (BUILTIN["range"],)
    result = assign(mine, [member(1), member(2)], {"a": 3})
    assert result == {"m02": frozenset({("a", 0), ("a", 1)}), "m01": frozenset({("a", 2)})}


@pytest.mark.parametrize("option, words", [
    ("cooperative-sticky", "unknown assignor 'cooperative-sticky'"),
    (["sticky", "roundrobin"], "unknown assignor 'roundrobin'"),
    ([], "lists no assignor"),
    ("", "unknown assignor ''"),
    (["sticky", "sticky"], "listed twice"),
    (42, "is an assignor name"),
    ([object()], "is not an assignor"),
    ([Reverse(), type("MyRange", (Reverse,), {"name": "range"})()], "takes the built-in name 'range'"),
])
def test_an_unknown_or_wrong_assignor_is_a_clear_config_error(option, words):
    with pytest.raises(AssignorError) as err:
        resolve(option)
    assert isinstance(err.value, ConfigError) and isinstance(err.value, RaylogError)
    assert words in str(err.value)
    if "unknown" in words:
        assert "known names: range, round_robin, sticky" in str(err.value)


class Broken:
    def __init__(self, result):
        self.name = "broken"
        self.result = result

    def assign(self, members, partition_counts, owners):
        return self.result


@pytest.mark.parametrize("result, words", [
    ({"m01": [("a", 0)], "m02": [("a", 0), ("a", 1)]}, "gave a/0 to both"),
    ({"m01": [("a", 0)]}, "left a/1 without an owner"),
    ({"m01": [("a", 0), ("a", 1)], "x": []}, "not a member"),
    ({"m01": [("a", 0), ("a", 1), ("a", 2)]}, "not a partition of a topic it subscribes to"),
    ({"m01": [("a", 0), ("a", 1), ("b", 0)]}, "not a partition of a topic it subscribes to"),
])
def test_an_assignment_that_is_not_one_owner_per_partition_is_refused(result, words):
    with pytest.raises(AssignorError, match="assignor 'broken'") as err:
        assign(Broken(result), [member(1), member(2)], {"a": 2, "b": 1})
    assert words in str(err.value)
