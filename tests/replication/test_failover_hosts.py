"""Failover across real network boundaries, on the hosts kit
(:mod:`raylog.testing.hosts`: the head host runs ZooKeeper and the Ray head,
disk hosts ``h2``-``h4`` each have an address and a disk of their own; this
process is the client machine):

* the leader's host cut off (its link down, its processes alive): a plain
  producer with ``acks="all"`` (the default retry policy, no resend loop of
  its own) loses nothing and is served again after the leader's ZooKeeper
  session expires; the old leader, back, follows the new one;
* a leader cut off from ZooKeeper alone, still reachable by clients (the
  zombie): once another replica leads, it acknowledges no write, neither
  ``acks="all"`` nor ``acks=1``; back, it truncates to the new leader's
  epoch boundary and follows, so nothing it took after its cut is served;
* nothing reads another host's files: each replica's log is on its own
  host's disk only, and a topic deleted while a host is cut off is removed
  from that host's disk by a task on that host once it is back.

Every wait is bounded by a generous deadline of the test's own (the machine
is shared); no time is asserted.
"""

from __future__ import annotations

import uuid

import pytest

from raylog.errors import NotOwnerError, RaylogError
from raylog.replication.admin import leader_actor
from raylog.replication.state import read_state
from raylog.testing import faults
from raylog.testing.host_checks import heal_host
from raylog.testing.on_hosts import wait as _wait
from raylog.testing.on_hosts import partition_state as _state
from raylog.testing.on_hosts import read_values as _read_all
from raylog.testing.on_hosts import replicated_topic

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(1800)]

def _cut(hosts, host) -> None:
    faults.cut_host(host)


def _heal(hosts, host) -> None:
    heal_host(hosts, host)


@pytest.fixture(scope="module")
def client(hosts):
    return hosts.client(cluster=f"failover-{uuid.uuid4().hex[:8]}")


def test_a_plain_producer_rides_through_a_cut_of_the_leaders_host(hosts, client):
    topic = replicated_topic(client)
    producer = client.producer(acks="all")
    try:
        for i in range(50):
            producer.send(topic, b"a%d" % i).result()
        _wait(lambda: len(_state(client, topic).isr) == 3, "the ISR is whole")
        before = _state(client, topic)
        leader_host = hosts.host(before.leader)
        _cut(hosts, leader_host)
        try:
            futures = [producer.send(topic, b"b%d" % i) for i in range(100)]
            errors = []
            for f in futures:
                try:
                    f.result()
                except RaylogError as err:
                    errors.append(repr(err))
            assert errors == [], errors[:3]  # a plain producer, default retries: nothing lost
            after = _state(client, topic)
            assert after.leader != before.leader and after.leader_epoch == before.leader_epoch + 1
        finally:
            _heal(hosts, leader_host)
        # the old leader, back, follows the new one and rejoins the ISR
        _wait(lambda: len(_state(client, topic).isr) == 3, "the old leader rejoins the ISR")
        assert _state(client, topic).leader == after.leader
    finally:
        producer.close()
    assert _read_all(client, topic, 150) == [b"a%d" % i for i in range(50)] + [b"b%d" % i for i in range(100)]


def test_a_zombie_leader_acknowledges_nothing_once_another_replica_leads(hosts, client):
    topic = replicated_topic(client)
    producer = client.producer(acks="all")
    for i in range(20):
        producer.send(topic, b"a%d" % i).result()
    _wait(lambda: len(_state(client, topic).isr) == 3, "the ISR is whole")
    before = _state(client, topic)
    zombie = client.registry.endpoint(topic, 0)
    leader_host = hosts.host(before.leader)
    faults.cut_from_zookeeper(leader_host, hosts)
    try:
        # its session expires; a follower takes over (the zombie still runs and is reachable)
        after = _wait(lambda: (s := _state(client, topic)).leader != before.leader and s, "a follower takes over")
        assert after.leader_epoch == before.leader_epoch + 1
        assert hosts.can_connect(None, zombie["host"], zombie["port"])  # clients still reach the zombie
        for acks in (-1, 1):
            with client.settings.broker_connection(zombie["host"], zombie["port"]) as conn:
                with pytest.raises(NotOwnerError) as refused:
                    conn.produce(topic, 0, _message_set(b"to-the-zombie"), acks=acks)
                assert refused.value.retriable
        # the new leader serves; a plain producer goes on
        for i in range(20):
            producer.send(topic, b"b%d" % i).result()
    finally:
        faults.heal(hosts)
    # back, the old leader follows (truncated to the new epoch's boundary) and rejoins the ISR
    _wait(lambda: len(_state(client, topic).isr) == 3, "the zombie rejoins the ISR as a follower")
    producer.close()
    values = _read_all(client, topic, 40)
    assert values == [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)]
    assert b"to-the-zombie" not in values
    # every replica asks the leader for its log end: the zombie's tail, if it had one, is truncated
    import ray

    _, actor = leader_actor(client._zk, client.registry, client.settings.cluster, topic, 0)

    def all_at_the_end():
        status = ray.get(actor.replica_status.remote(), timeout=60)
        ends = status["follower_ends"]
        return len(ends) == 2 and all(end == status["log_end_offset"] for end in ends.values())

    _wait(all_at_the_end, "every replica at the leader's log end")


def _message_set(value: bytes) -> bytes:
    from raylog.storage.message import encode_message_set

    return encode_message_set([value])


def test_each_hosts_logs_are_on_its_own_disk_and_a_delete_reaches_a_host_that_was_cut_off(hosts, client):
    topic = replicated_topic(client)
    producer = client.producer(acks="all")
    for i in range(10):
        producer.send(topic, b"v%d" % i).result()
    producer.close()
    _wait(lambda: len(_state(client, topic).isr) == 3, "the ISR is whole")
    state = _state(client, topic)
    place = client.registry.placement(topic, 0)
    from raylog.replication.assignment import replica_log_dir

    dirs = {node: replica_log_dir(place["log_dir"], node, state.origin) for node in state.replicas}
    for host in hosts.disk_hosts:
        for node, log_dir in dirs.items():
            there = host.run(["test", "-d", log_dir], check=False).returncode == 0
            assert there == (node == host.name), f"{log_dir} of {node} on {host.name}: {there}"
    # a follower's host is cut off while the topic is deleted: its log stays there until it is back
    follower = hosts.host(next(n for n in state.replicas if n != state.leader))
    _cut(hosts, follower)
    try:
        client.delete_topic(topic)
        pending = [r for r in client.repair(timeout_s=60) if r["topic"] == topic and r["node"] == follower.name]
        assert pending and all(r["state"] in ("pending", "failed") for r in pending), pending
    finally:
        _heal(hosts, follower)

    def removed():
        client.repair(timeout_s=60)
        return follower.run(["test", "-e", dirs[follower.name]], check=False).returncode != 0

    _wait(removed, f"the deleted log is removed from {follower.name}'s disk")
    for host in hosts.disk_hosts:
        assert host.run(["test", "-e", dirs[host.name]], check=False).returncode != 0


def test_reads_through_followers_on_other_hosts_and_across_a_cut_of_a_leaders_host(hosts, client):
    """tests/actors/test_replicated_reads.py's scenario across hosts: a read
    plan lists every in-sync replica (the leader first); each range read
    through each follower, on its own host, gives the leader's rows; with a
    leader's host cut off, the ranges planned before read the same rows (from
    a replica that answers), and a new plan leads with the new leader."""
    from raylog.read import plan_read, read_range

    def rows(batches):
        return [[b.column(3)[i].as_py(), b.column(4)[i].as_py(), b.column(1)[i].as_py().decode()]
                for b in batches for i in range(b.num_rows)]

    name = f"t-{uuid.uuid4().hex[:8]}"
    client.create_topic(name, partitions=2, replication_factor=3, min_insync_replicas=2, flush_ms=5)
    producer = client.producer(acks="all")
    for i in range(100):
        producer.send(name, b"v%03d" % i, key=b"k%d" % (i % 7))
    producer.flush()
    producer.close()
    states = {p: read_state(client._zk, client.registry.paths, name, p)[0] for p in range(2)}
    _wait(lambda: all(len(read_state(client._zk, client.registry.paths, name, p)[0].isr) == 3 for p in range(2)),
          "every ISR whole")
    plan = plan_read(name, client=client)
    by_leader = {r.partition: rows(read_range(r, plan.settings, replica=None)) for r in plan.ranges}
    assert sum(len(v) for v in by_leader.values()) == 100
    for r in plan.ranges:
        assert r.replicas[0].node == states[r.partition].leader and len(r.replicas) == 3
        assert {c.host for c in r.replicas} == {hosts.host(c.node).address for c in r.replicas}  # their own hosts
        for c in r.replicas[1:]:
            # a follower learns the committed offset with its next fetch
            _wait(lambda: rows(read_range(r, plan.settings, replica=c.node)) == by_leader[r.partition],
                  f"{c.node} serves partition {r.partition}")
    old = states[0].leader
    faults.cut_host(hosts.host(old))
    try:
        _wait(lambda: _state(client, name).leader != old, "a follower takes over partition 0")
        assert {r.partition: rows(read_range(r, plan.settings)) for r in plan.ranges} == by_leader
        replanned = [r for r in plan_read(name, client=client).ranges if r.partition == 0][0]
        assert replanned.replicas[0].node == _state(client, name).leader
    finally:
        _heal(hosts, hosts.host(old))
    _wait(lambda: all(len(read_state(client._zk, client.registry.paths, name, p)[0].isr) == 3 for p in range(2)),
          "every ISR whole again")


def test_a_leader_whose_process_dies_is_replaced_by_a_follower_and_a_plain_producer_loses_nothing(hosts, client):
    """The leader's process SIGKILLed on its host (its port refuses, its
    ZooKeeper session lingers): an in-sync follower on another host takes
    over by compare-and-set (epoch + 1) without waiting for the session; a
    plain producer with ``acks="all"`` loses nothing and stores nothing
    twice; the killed replica, restarted by Ray on its own host, follows and
    catches up: every replica's log, each read on its own host's disk, is
    the same bytes."""
    import os
    import signal

    import ray

    from raylog.testing.host_checks import log_bytes_on
    from raylog.replication.assignment import replica_log_dir

    topic = replicated_topic(client)  # the default replica_lag_ms and a 10 s session: the old way waited for both
    producer = client.producer(acks="all")
    try:
        for i in range(100):
            producer.send(topic, b"a%d" % i).result()
        _wait(lambda: len(_state(client, topic).isr) == 3, "the ISR is whole")
        before, actor = leader_actor(client._zk, client.registry, client.settings.cluster, topic, 0)
        os.kill(ray.get(actor.pid.remote(), timeout=60), signal.SIGKILL)  # one PID space: the hosts share it
        errors = []
        for f in [producer.send(topic, b"b%d" % i) for i in range(100)]:
            try:
                f.result()
            except RaylogError as err:
                errors.append(repr(err))
        assert errors == [], errors[:3]
        after = _state(client, topic)
        assert after.leader != before.leader and after.leader_epoch == before.leader_epoch + 1
        # the killed replica, restarted by Ray, follows the new leader and catches up
        _wait(lambda: len(_state(client, topic).isr) == 3, "the killed replica rejoins the ISR")
        final = _state(client, topic)
        assert (final.leader, final.leader_epoch) == (after.leader, after.leader_epoch)
    finally:
        producer.close()
    assert _read_all(client, topic, 200) == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]
    place = client.registry.placement(topic, 0)
    dirs = {node: replica_log_dir(place["log_dir"], node, final.origin) for node in final.replicas}
    _wait(lambda: len({log_bytes_on(hosts.host(n), d) for n, d in dirs.items()}) == 1,
          "every replica's log is the same bytes")
