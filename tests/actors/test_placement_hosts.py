"""Partitions across real hosts (the hosts kit, :mod:`raylog.testing.hosts`:
disk hosts ``h2``-``h4``, the head and the client machine without disk):
spread over the hosts that offer disk, pinned there, and never moved away
when their host is lost; back on its disk, the host serves them again.

The host this test kills runs again when it ends (the hosts cluster is
shared by the session). Every wait is bounded; no time is asserted.
"""

from __future__ import annotations

import collections
import time
import uuid

import pytest

from raylog.testing import faults
from raylog.testing.host_checks import ray_node_alive
from raylog.testing.on_hosts import bring_back, wait

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(1200)]

#: how long a partition of a lost host is watched for a move (Ray would restart a
#: movable actor elsewhere at once)
WATCH_S = 5.0


def test_partitions_spread_over_disk_hosts_and_stay_pinned_when_their_host_is_lost(hosts):
    import ray

    from raylog.actors.placement import NODE_LABEL

    client = hosts.client(cluster=f"placement-{uuid.uuid4().hex[:8]}")
    client.create_topic("spread", partitions=4)
    node_of_id = {n["NodeID"]: (n.get("Labels") or {}).get(NODE_LABEL) for n in ray.nodes()}

    placed = {}
    for p in range(4):
        actor = client.partition_actor("spread", p)
        placed[p] = (client.registry.placement("spread", p)["node"],
                     node_of_id[ray.get(actor.node_id.remote(), timeout=60)])
    # round-robin over the three disk hosts, none on the head or the client machine; each runs where registered
    counts = collections.Counter(registered for registered, _ in placed.values())
    assert set(counts) == {h.name for h in hosts.disk_hosts} and sorted(counts.values()) == [1, 1, 2], placed
    assert all(registered == running_on for registered, running_on in placed.values()), placed

    producer = client.producer(acks=1)
    for i in range(100):
        producer.send("spread", b"v%d" % i, key=b"k%d" % i)
    producer.close()

    # The host holding two partitions is lost (every process on it killed): its actors must not move.
    victim = hosts.host(counts.most_common(1)[0][0])
    victims = [p for p, (registered, _) in placed.items() if registered == victim.name]
    faults.kill_host(victim)
    try:
        wait(lambda: not ray_node_alive(victim), f"Ray counts {victim.name}'s node dead")
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            for p in victims:
                actor = client.partition_actor("spread", p)
                ready, _ = ray.wait([actor.node_id.remote()], timeout=1)
                try:  # pending (waiting for its host) or unavailable: not moved
                    moved = node_of_id.get(ray.get(ready[0])) if ready else None
                except ray.exceptions.RayError:
                    moved = None
                assert moved is None, f"partition {p} of {victim.name} moved to {moved}"
                assert client.registry.placement("spread", p)["node"] == victim.name

        def serving(p):
            try:
                return ray.get(client.partition_actor("spread", p).ping.remote(), timeout=10)
            except ray.exceptions.RayError:  # the cluster settles after a host's loss
                return False

        for p in set(range(4)) - set(victims):
            wait(lambda: serving(p), f"partition {p} on a surviving host serves")
    finally:
        bring_back(hosts, victim)
    # back on its disk, the host serves its partitions again, and they are still its own
    node_of_id = {n["NodeID"]: (n.get("Labels") or {}).get(NODE_LABEL) for n in ray.nodes() if n["Alive"]}

    def back(p):
        try:
            return node_of_id.get(ray.get(client.partition_actor("spread", p).node_id.remote(), timeout=10))
        except ray.exceptions.RayError:
            return None

    for p in victims:
        assert wait(lambda: back(p), f"partition {p} serves again") == victim.name
    client.delete_topic("spread")
