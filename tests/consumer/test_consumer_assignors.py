"""``partition_assignment_strategy``: consumer groups with round_robin and
sticky, end to end (real ZooKeeper, real Ray, partition actors, sockets).

Each partition is read by exactly one member once the group settles, no
record is lost across a join and a leave, and with sticky a partition whose
owner stays is never released: its owner is never told to revoke it and
reads every record of it. Bad input first.
"""

from __future__ import annotations

import time

import pytest

from raylog.errors import AssignorError, ConfigError

from consumer_helpers import wait_for

SESSION_MS = 3000
PARTITIONS = 6


def _produce(client, topic: str, values: list[bytes]) -> None:
    import ray

    producer = client.producer(batch_size=50, acks=1)
    for v in values:
        producer.send(topic, v, key=v)
    producer.close()
    for p in range(client.metadata.partitions(topic)):
        ray.get(client.partition_actor(topic, p).flush.remote())


def _owners(client, group: str, topic: str) -> dict[int, str]:
    zk = client.registry.zk
    path = client.registry.paths.owners(group, topic)
    if not zk.exists(path):
        return {}
    return {int(p): zk.get(f"{path}/{p}")[0].decode() for p in zk.get_children(path)}


class Member:
    """A consumer with what it was handed and told, by partition."""

    def __init__(self, client, topic, group, strategy, name):
        self.name = name
        self.revoked: set = set()
        self.consumer = client.consumer(
            topic, group=group, auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
            auto_commit_interval_ms=100, settle_ms=100, consumer_id=name,
            partition_assignment_strategy=strategy, on_revoked=self.revoked.update)
        self.got: list = []

    def poll(self):
        batch = self.consumer.poll(timeout_ms=20)
        self.got.extend(batch)
        return batch


def _settled(members, topic, client, group) -> bool:
    """Every partition is assigned to exactly one member, and the owner
    nodes say the same."""
    parts = [m.consumer.assignment() for m in members]
    if sum(len(p) for p in parts) != PARTITIONS or len(frozenset().union(*parts)) != PARTITIONS:
        return False
    owners = _owners(client, group, topic)
    return all(owners.get(p) == m.name for m, mine in zip(members, parts) for _, p in mine)


def _poll_until(members, predicate, what, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        for m in members:
            m.poll()


def _everything_read(members, values: set) -> bool:
    return values <= {msg.value for m in members for msg in m.got}


# -- bad input ---------------------------------------------------------------------


def test_an_unknown_assignor_name_is_refused_and_the_group_loses_nothing(raylog_client, make_topic):
    topic = make_topic(partitions=PARTITIONS)
    group = "g-assign-typo"
    first = Member(raylog_client, topic, group, "sticky", "first")
    try:
        values = [b"typo-%d" % i for i in range(120)]
        _produce(raylog_client, topic, values)
        _poll_until([first], lambda: _everything_read([first], set(values[:60])), "the first half read")
        for option in ("cooperative-sticky", ["sticky", "roundrobin"], 7):
            with pytest.raises(AssignorError) as err:
                raylog_client.consumer(topic, group=group, partition_assignment_strategy=option)
            assert isinstance(err.value, ConfigError)
            assert "known names: range, round_robin, sticky" in str(err.value)
        # nobody joined; the member keeps every partition and reads every record
        zk = raylog_client.registry.zk
        assert zk.get_children(raylog_client.registry.paths.ids(group)) == ["first"]
        assert first.consumer.assignment() == frozenset((topic, p) for p in range(PARTITIONS))
        _poll_until([first], lambda: _everything_read([first], set(values)), "every record read")
        assert first.revoked == set()
        # a consumer without a group checks the name too
        with pytest.raises(AssignorError):
            raylog_client.consumer(topic, partition_assignment_strategy="stiky")
    finally:
        first.consumer.close()


# -- round_robin, and members listing different preferences ----------------------------


def test_round_robin_group_reads_every_record_once_per_partition_owner_across_a_join_and_a_leave(
        raylog_client, make_topic):
    topic = make_topic(partitions=PARTITIONS)
    group = "g-assign-rr"
    a = Member(raylog_client, topic, group, "round_robin", "a")
    # b prefers sticky but also supports round_robin: the group agrees on round_robin
    b = Member(raylog_client, topic, group, ["sticky", "round_robin"], "b")
    members = [a, b]
    c = None
    try:
        _poll_until(members, lambda: _settled(members, topic, raylog_client, group), "two members settled")
        assert a.consumer.group_assignor == b.consumer.group_assignor == "round_robin"
        assert a.consumer.assignment() == frozenset((topic, p) for p in range(0, PARTITIONS, 2))
        first = [b"rr-one-%d" % i for i in range(300)]
        _produce(raylog_client, topic, first)
        _poll_until(members, lambda: _everything_read(members, set(first[:100])), "some records read")

        c = Member(raylog_client, topic, group, ["round_robin", "range"], "c")  # joins
        members.append(c)
        _poll_until(members, lambda: _settled(members, topic, raylog_client, group), "three members settled")
        assert [len(m.consumer.assignment()) for m in members] == [2, 2, 2]
        second = [b"rr-two-%d" % i for i in range(300)]
        _produce(raylog_client, topic, second)
        _poll_until(members, lambda: _everything_read(members, set(first) | set(second)), "records after the join")

        a.consumer.close()  # leaves
        members.remove(a)
        _poll_until(members, lambda: _settled(members, topic, raylog_client, group), "two members settled again")
        third = [b"rr-three-%d" % i for i in range(300)]
        _produce(raylog_client, topic, third)
        everything = set(first) | set(second) | set(third)
        _poll_until(members, lambda: _everything_read([a, *members], everything), "records after the leave")
        assert {m.consumer.group_assignor for m in members} == {"round_robin"}
    finally:
        for m in (a, b, c):
            if m is not None:
                m.consumer.close()


# -- sticky: what stays is never released ------------------------------------------------


def test_sticky_group_keeps_reading_the_partitions_that_stay_across_a_join_and_a_leave(raylog_client, make_topic):
    topic = make_topic(partitions=PARTITIONS)
    group = "g-assign-sticky"
    a = Member(raylog_client, topic, group, "sticky", "a")
    b = Member(raylog_client, topic, group, "sticky", "b")
    members = [a, b]
    c = None
    try:
        _poll_until(members, lambda: _settled(members, topic, raylog_client, group), "two members settled")
        assert a.consumer.group_assignor == "sticky"
        held_before = {m.name: m.consumer.assignment() for m in members}
        for m in members:
            m.revoked.clear()
        first = [b"st-one-%d" % i for i in range(300)]
        _produce(raylog_client, topic, first)
        _poll_until(members, lambda: _everything_read(members, set(first[:100])), "some records read")

        c = Member(raylog_client, topic, group, "sticky", "c")  # joins: takes one from a and one from b
        members.append(c)
        _poll_until(members, lambda: _settled(members, topic, raylog_client, group), "three members settled")
        for m in (a, b):
            kept = m.consumer.assignment()
            assert kept <= held_before[m.name] and len(kept) == 2
            assert m.revoked == held_before[m.name] - kept  # only what moved was revoked
        second = [b"st-two-%d" % i for i in range(300)]
        _produce(raylog_client, topic, second)
        _poll_until(members, lambda: _everything_read(members, set(first) | set(second)), "records after the join")

        held_after_join = {m.name: m.consumer.assignment() for m in members}
        for m in members:
            m.revoked.clear()
        a.consumer.close()  # the oldest leaves: its two partitions go to b and c; nothing else moves
        members.remove(a)
        _poll_until(members, lambda: _settled(members, topic, raylog_client, group), "two members settled again")
        for m in members:
            assert m.revoked == set() and m.consumer.assignment() >= held_after_join[m.name]
        third = [b"st-three-%d" % i for i in range(300)]
        _produce(raylog_client, topic, third)
        everything = set(first) | set(second) | set(third)
        _poll_until(members, lambda: _everything_read([a, *members], everything), "records after the leave")

        # a partition b kept from the start was read by b alone, every record of it exactly once
        stayed = held_before["b"] & held_after_join["b"]
        assert stayed
        for _, p in stayed:
            by = {m.name: [msg.offset for msg in m.got if msg.partition == p] for m in (a, b, c)}
            assert by["a"] == by["c"] == [], f"partition {p} was read by another member"
            assert len(by["b"]) == len(set(by["b"])) > 0
    finally:
        for m in (a, b, c):
            if m is not None:
                m.consumer.close()
