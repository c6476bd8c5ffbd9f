"""Bounded reads of a replicated topic across real network boundaries, on
the hosts kit (:mod:`raylog.testing.hosts`: disk hosts ``h2``-``h4``, each
with an address, a Ray node and a disk of its own; this process is the
client machine), RF 3 over the three disk hosts:

* the plan lists the in-sync candidates (the leader first) with their own
  hosts' addresses and Ray nodes, the leader's node being the range's
  locality; a read through a follower gives the leader's rows and bytes;
* a follower never serves past the high watermark it learned (one ISR
  member stalled, another has more bytes than it may serve);
* Ray Data's ``read_raylog`` (its tasks on the hosts' nodes) returns every
  message once;
* after a leader's host is lost (every process of it killed), the ranges
  planned before still read the same rows (and Ray Data too), and a new plan
  names the new leader's node, not the lost one.

(A cut of a leader's host during reads: tests/replication/test_failover_hosts.py.)
Every wait is bounded by a generous deadline of the test's own (the machine
is shared); no time is asserted.
"""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from raylog.testing import faults
from raylog.testing.clusters import wait_until
from raylog.testing.host_checks import heal_host

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(1800)]

#: the test's own bound on every wait (a loaded machine: generous)
WAIT_S = 180.0
TOPIC = "rr"
PARTITIONS = 3


def _wait(check, what: str, timeout_s: float = WAIT_S) -> None:
    assert wait_until(check, timeout_s), f"not within {timeout_s} s: {what}"


def _rows(batches) -> list:
    return [[b.column(3)[i].as_py(), b.column(4)[i].as_py(), b.column(1)[i].as_py().decode()]
            for b in batches for i in range(b.num_rows)]


class _Fallbacks(logging.Handler):
    """Counts the reader's lines about a follower read given up for the leader."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        if "reading from the leader" in record.getMessage():
            self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def fallbacks():
    logger = logging.getLogger("raylog.read.reader")
    handler, level = _Fallbacks(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def topic(hosts):
    """``(client, hws, leaders)``: RF 3 over the three disk hosts, 300
    messages acknowledged by every replica."""
    from raylog.replication.state import read_state

    client = hosts.client(cluster=f"reads-{uuid.uuid4().hex[:8]}")
    client.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3, min_insync_replicas=2,
                        replica_lag_ms=10000, flush_ms=5)
    producer = client.producer(acks="all")
    for i in range(300):
        producer.send(TOPIC, b"v%03d" % i, key=b"k%d" % (i % 11))
    producer.flush()
    producer.close()
    zk, paths = client.registry.zk, client.registry.paths
    hws = {p: client.offsets(TOPIC, p)[1] for p in range(PARTITIONS)}
    leaders = {p: read_state(zk, paths, TOPIC, p)[0].leader for p in range(PARTITIONS)}
    yield client, hws, leaders
    client.delete_topic(TOPIC)


def _actor(client, p: int, node: str):
    import ray

    from raylog.actors.partition import actor_name
    from raylog.config import NAMESPACE
    from raylog.replication.assignment import replica_actor_name
    from raylog.replication.state import read_state

    first = read_state(client.registry.zk, client.registry.paths, TOPIC, p)[0].replicas[0]
    return ray.get_actor(replica_actor_name(actor_name(client.settings.cluster, TOPIC, p), node, first),
                         namespace=NAMESPACE)


def _leader(client, p: int) -> str:
    from raylog.replication.state import read_state

    return read_state(client.registry.zk, client.registry.paths, TOPIC, p)[0].leader


def test_reads_through_followers_on_their_own_hosts_a_stalled_follower_bound_and_ray_data(hosts, topic, fallbacks):
    import ray

    from raylog.read import plan_read, read_range, read_raylog
    from raylog.read.datasource import task_replicas

    client, hws, leaders = topic
    disk = [h.name for h in hosts.disk_hosts]

    def served(p, node):
        return ray.get(_actor(client, p, node).replica_status.remote(), timeout=60).get("served_high_watermark")

    _wait(lambda: all(served(p, n) == hws[p] for p in range(PARTITIONS) for n in disk if n != leaders[p]),
          "every follower learned the high watermark")

    # the plan: per range the candidates (leader first), each on its own host and Ray node
    plan = plan_read(TOPIC, client=client)
    ray_node = {n: ray.get(_actor(client, 0, n).node_id.remote(), timeout=60) for n in disk}
    assert sorted(r.partition for r in plan.ranges) == list(range(PARTITIONS))
    for r in plan.ranges:
        assert sorted(c.node for c in r.replicas) == disk and r.replicas[0].node == leaders[r.partition]
        assert r.replicas[0].leader and r.end == hws[r.partition]
        assert all(c.node_id == ray_node[c.node] for c in r.replicas)
        assert r.node_id == ray_node[leaders[r.partition]]  # the locality: the leader's node
        assert [c.host for c in r.replicas] == [hosts.host(c.node).address for c in r.replicas]

    # each range through each follower: the leader's rows, and the same raw bytes
    by_leader = {r.partition: _rows(read_range(r, plan.settings, replica=None)) for r in plan.ranges}
    assert sum(len(v) for v in by_leader.values()) == 300
    checked = 0
    for r in plan.ranges:
        for c in r.replicas[1:]:
            assert _rows(read_range(r, plan.settings, replica=c.node)) == by_leader[r.partition], c.node
            with plan.settings.broker_connection(c.host, c.port) as f, \
                    plan.settings.broker_connection(r.host, r.port) as lead:
                assert bytes(f.fetch(TOPIC, r.partition, r.start, r.size).data) == \
                    bytes(lead.fetch(TOPIC, r.partition, r.start, r.size).data)
            checked += 1
    assert checked == 2 * PARTITIONS and fallbacks == []

    # Ray Data: every message once (its tasks on the hosts read from their assigned replicas)
    assert sum(1 for _, c in task_replicas(plan) if c is not None and not c.leader) >= 1
    ds_rows = sorted([r["partition"], r["offset"], r["value"].decode()]
                     for r in read_raylog(TOPIC, plan=plan).take_all())
    assert ds_rows == sorted(row for v in by_leader.values() for row in v)
    assert sorted(v for _, _, v in ds_rows) == ["v%03d" % i for i in range(300)]

    # a follower never serves past what it learned: one follower of partition 0 stalls (still in the
    # ISR for replica_lag_ms), so the committed offset stays; the other replicates more (acks=1) than
    # it may serve
    p = 0
    stalled, keeper = [n for n in disk if n != leaders[p]]
    stalled_pid = faults.actor_pid(_actor(client, p, stalled))
    keeper_actor = _actor(client, p, keeper)
    ones = client.producer(acks=1)
    status = {}
    try:
        faults.stop_process(stalled_pid)
        for i in range(40):
            ones.send(TOPIC, b"x%03d" % i, partition=p)
        ones.flush()

        def keeper_ahead():
            status.update(ray.get(keeper_actor.replica_status.remote(), timeout=60))
            return status["log_end_offset"] > status["served_high_watermark"]

        assert wait_until(keeper_ahead, 8), status  # within replica_lag_ms
        k = json.loads(client.registry.zk.get(f"{client.registry.paths.partition(TOPIC, p)}/replicas/{keeper}")[0])
        assert k["host"] == hosts.host(keeper).address
        with plan.settings.broker_connection(k["host"], k["port"]) as conn:
            _, latest = conn.offsets(TOPIC, p)
            whole = conn.fetch(TOPIC, p, 0, 1 << 20)
            above = conn.fetch(TOPIC, p, latest, 1 << 20)
        committed = client.offsets(TOPIC, p)[1]
    finally:
        faults.resume_process(stalled_pid)
        ones.close()
    served_hw = status["served_high_watermark"]
    # the keeper holds more than the committed offset it learned and serves only that
    assert served_hw == latest == whole.high_watermark == len(whole.data), (status, latest, whole.high_watermark)
    assert served_hw < status["log_end_offset"] and len(above.data) == 0
    assert served_hw <= committed


def test_reads_planned_before_a_leaders_host_is_lost_read_the_same_rows(hosts, topic, fallbacks):
    import ray

    from raylog.read import plan_read, read_range, read_raylog

    client, _, _ = topic
    # every replica back in the ISR (the stalled follower of the test before rejoined)
    _wait(lambda: all(len(client.describe_topic(TOPIC)["partitions"][p]["isr"]) == 3 for p in range(PARTITIONS)),
          "every ISR whole")
    plan = plan_read(TOPIC, client=client)
    by_leader = {r.partition: _rows(read_range(r, plan.settings, replica=None)) for r in plan.ranges}
    expected = sorted(row for v in by_leader.values() for row in v)
    assert len(expected) == 340

    p = 0
    old = _leader(client, p)
    lost = hosts.host(old)
    faults.kill_host(lost)  # its Ray node and every replica on it; its disk stays
    try:
        _wait(lambda: _leader(client, p) != old, f"a follower takes over partition {p} from {old}")
        del fallbacks[:]
        # the ranges planned before read the same rows, through the lost host too (from a replica that answers)
        assert {r.partition: _rows(read_range(r, plan.settings)) for r in plan.ranges} == by_leader
        through_lost = [r for r in plan.ranges if old in [c.node for c in r.replicas[1:]]]
        assert through_lost
        for r in through_lost:
            assert _rows(read_range(r, plan.settings, replica=old)) == by_leader[r.partition]
        assert fallbacks, "a read through the lost host gave up for the leader"
        # a new plan leads with the new leader's node; the lost one is no candidate
        replanned = [r for r in plan_read(TOPIC, client=client).ranges if r.partition == p][0]
        new = _leader(client, p)
        assert replanned.replicas[0].node == new and old not in [c.node for c in replanned.replicas]
        assert replanned.node_id == ray.get(_actor(client, p, new).node_id.remote(), timeout=60)
        ds_after = sorted([r["partition"], r["offset"], r["value"].decode()]
                          for r in read_raylog(TOPIC, plan=plan).take_all())
        assert ds_after == expected
    finally:
        heal_host(hosts, lost)
    _wait(lambda: all(len(client.describe_topic(TOPIC)["partitions"][q]["isr"]) == 3 for q in range(PARTITIONS)),
          f"{old}'s replicas back in every ISR")
