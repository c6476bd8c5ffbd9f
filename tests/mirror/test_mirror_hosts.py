"""A mirror between two raylog clusters across a cut link, on the hosts kit
(:mod:`raylog.testing.hosts`: the head ``h1`` runs ZooKeeper and the Ray
head, disk hosts ``h2``-``h4`` each have an address and a disk of their own;
this process is the client machine, where the mirror's actors run).

The source cluster's topic has two partitions, the target's copy two; the
names are chosen so that one disk host (the *cut host*) holds source
partition 0 and target partition 1, and the other two hold one partition
each::

    source p0 (cut host) ──mirror──► target p0 (another host)
    source p1 (another)  ──mirror──► target p1 (cut host)

So one cut silences both ends of the mirror: a fetch from the source and a
produce into the target, each on a connection that just goes quiet (the
mirror's own actors run elsewhere: the cut host is chosen once they run).
While an ``acks="all"`` producer writes to both source partitions, the cut
host's link is down for longer than every timeout of the mirror (the
partitions' ZooKeeper sessions expire, their endpoints go) and until Ray
counts the host's node dead; then it is up again with a new Ray node, and
both partitions serve again from new processes on new ports. Once
the producer stops and the mirror caught up, each target partition holds
exactly its source partition's messages, in order, none twice, none lost,
and ``status`` shows no lag (docs/design.md sections 6, 8 and 9).

Every wait is bounded by a generous deadline (the machine is shared); no
time is asserted.
"""

from __future__ import annotations

import collections
import time
import uuid

import pytest

from raylog.errors import DeliveryError
from raylog.mirror import spec as specs
from raylog.storage.stable_hash import stable_bucket
from raylog.testing import faults
from raylog.testing.host_checks import heal_host, ray_node_alive
from raylog.testing.on_hosts import Sending, wait

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]

#: how long the cut host's link stays down at least: past the mirror's
#: timeouts (ZooKeeper sessions: 10 s, its consumer's group session: 6 s); it
#: stays down until Ray counts the host's node dead
CUT_S = 20.0
PARTITIONS = 2


@pytest.fixture(scope="module")
def clusters(hosts):
    """Two raylog clusters of one Ray cluster and one ZooKeeper (their own
    roots, tokens and topics): the source and the target."""
    tag = uuid.uuid4().hex[:6]
    return hosts.client(cluster=f"msrc-{tag}"), hosts.client(cluster=f"mdst-{tag}")


def _placed_topic(prefix: str, source_cluster: str, disks: list, avoid: set) -> tuple[str, object]:
    """A source topic name ``<prefix><random>`` whose partition 0 lands on a
    disk host not in ``avoid`` while its target copy ``<source>.<topic>``
    starts one host before, so that target partition 1 lands on that host
    too (:func:`raylog.actors.placement.place_topic`: the first partition
    where the name's stable hash points, the next one round-robin).
    ``(name, that host)``."""
    while True:
        name = f"{prefix}{uuid.uuid4().hex[:6]}"
        first = stable_bucket(name.encode(), len(disks))
        target_first = stable_bucket(f"{source_cluster}.{name}".encode(), len(disks))
        if (target_first + 1) % len(disks) == first and disks[first].address not in avoid:
            return name, disks[first]


def _mirror_addresses(target_cluster: str, name: str) -> set[str]:
    """The addresses of the hosts the mirror's actors (its controller and
    member) run on now, from Ray's actor table (the hosts' Ray has no
    dashboard, hence no state API)."""
    from ray._private import state

    names = {specs.controller_name(target_cluster, name), specs.member_name(target_cluster, name, 0)}
    found = {a["Name"]: a["Address"]["IPAddress"] for a in state.actors().values()
             if a["Name"] in names and a["State"] == "ALIVE"}
    assert set(found) == names, found
    return set(found.values())


def _finish(sender) -> None:
    try:
        sender.finish()
    except DeliveryError:  # the failures its futures reported already
        pass


def _read_partitions(client, topic: str) -> dict[int, list[bytes]]:
    """Every value of every partition up to its end offset now, in order."""
    ends = client.end_offsets(topic)
    out = {p: [] for p in range(PARTITIONS)}
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        deadline = time.monotonic() + 120
        while any((consumer.position(topic, p) or 0) < ends[p] for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, f"{topic} could not be read to its end {ends}"
            for m in consumer.poll(timeout_ms=300):
                out[m.partition].append(m.value)
    finally:
        consumer.close()
    return out


def anomalies(source: list[bytes], target: list[bytes]) -> dict[str, list]:
    """What a target partition does wrong against its source partition, in the
    fault checker's names (:mod:`raylog.testing.checker`): ``lost-write``
    (in the source, not in the target), ``duplicate`` (stored twice),
    ``garbage-read`` (in the target, never in the source) and ``reordered``
    (the first position where the orders differ, when each holds the
    other's values once)."""
    have, want = collections.Counter(target), collections.Counter(source)
    found = {
        "lost-write": [v for v in source if v not in have][:5],
        "duplicate": [v for v, n in have.items() if n > 1][:5],
        "garbage-read": [v for v in target if v not in want][:5],
        "reordered": [],
    }
    if not any(found.values()) and target != source:
        first = next(i for i, (a, b) in enumerate(zip(source, target)) if a != b)
        found["reordered"] = [first, source[first], target[first]]
    return {name: found[name] for name in found if found[name]}


def _rows(handle, topic: str) -> list[dict]:
    return [r for r in handle.status()["partitions"] if r["topic"] == topic]


def test_a_cut_of_the_host_at_both_ends_of_the_mirror_under_a_running_producer_loses_and_doubles_nothing(
        hosts, clusters):
    source, target = clusters
    disks = sorted(hosts.disk_hosts, key=lambda h: h.label)
    prefix = f"clicks-{uuid.uuid4().hex[:4]}-"
    source.create_topic(prefix + "first")  # the mirror starts with one topic that matches
    name = f"cut-{uuid.uuid4().hex[:6]}"
    handle = target.mirror(source_zookeeper=hosts.zookeeper_address, source_cluster=source.settings.cluster,
                           source_token=source.settings.token, topics=f"{prefix}.*", rename="{source}.{topic}",
                           members=1, name=name, scan_interval_s=2.0)
    try:
        # the cut host is none that the mirror's own actors run on: the mirror
        # stays up, and its links to the source and the target go quiet
        topic, cut_host = _placed_topic(prefix, source.settings.cluster, disks,
                                        _mirror_addresses(target.settings.cluster, name))
        dst = f"{source.settings.cluster}.{topic}"
        source.create_topic(topic, partitions=PARTITIONS, flush_ms=5)
        wait(lambda: target.registry.topic_exists(dst), "the mirror makes the target topic")
        assert source.registry.placement(topic, 0)["node"] == cut_host.label
        assert target.registry.placement(dst, 1)["node"] == cut_host.label
        assert cut_host.label not in {source.registry.placement(topic, 1)["node"],
                                      target.registry.placement(dst, 0)["node"]}
        senders = [Sending(source, topic, p, result_s=90, pause_s=0.005) for p in range(PARTITIONS)]
        try:
            for s in senders:
                s.more_acked()
            wait(lambda: len(rows := _rows(handle, topic)) == PARTITIONS and all(r["mirrored"] for r in rows),
                 "the mirror copies both partitions")
            faults.cut_host(cut_host)
            try:
                # the producer goes on (partition 1 is served, partition 0
                # waits) until Ray, too, gave the host up: back, its raylet
                # ends itself and the host gets a new Ray node (a heal just
                # before Ray counts it dead would leave it with none)
                time.sleep(CUT_S)
                wait(lambda: not ray_node_alive(cut_host), f"Ray counts {cut_host.name}'s node dead")
            finally:
                heal_host(hosts, cut_host)
            for s in senders:
                s.more_acked()
        finally:
            for s in senders:
                _finish(s)
        want = _read_partitions(source, topic)
        for s in senders:  # what the producer was told is stored, in its order
            got = [v for v in want[s.partition] if v in set(s.acked)]
            assert got == s.acked, f"source partition {s.partition} lost acknowledged sends"
        assert all(len(want[p]) > 40 for p in range(PARTITIONS)), {p: len(v) for p, v in want.items()}
        wait(lambda: all(r["lag_bytes"] == 0 for r in _rows(handle, topic)),
             f"the mirror catches up: {handle.status()}", timeout_s=300)
        time.sleep(2.0)  # anything stored twice would show by now
        got = _read_partitions(target, dst)
        found = {p: anomalies(want[p], got[p]) for p in range(PARTITIONS)}
        assert found == {0: {}, 1: {}}, found
        assert got == want
        rows = _rows(handle, topic)
        assert [(r["partition"], r["lag_bytes"], r["lag_s"]) for r in rows] == [(0, 0, 0.0), (1, 0, 0.0)], rows
        members = handle.status()["members"]
        assert all(m["alive"] for m in members), members
        assert cut_host.address not in _mirror_addresses(target.settings.cluster, name)
    finally:
        handle.stop()
