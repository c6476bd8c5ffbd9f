"""A replica whose stored bytes were damaged mends them from an in-sync
replica when it restarts, across hosts (:mod:`raylog.testing.hosts`): a
byte flipped in the follower's flushed segment on its own host's disk, the
follower's process killed; recovery finds and keeps the damage, the
restarted follower fetches the range from the leader (on another host) and
writes it back: the two logs, each read on its own host, are the same bytes
again, and a consumer reads every value once, in order.

Every wait is bounded by a generous deadline of the test's own; no time is
asserted.
"""

from __future__ import annotations

import uuid

import pytest
import ray

from raylog.config import NAMESPACE, actor_name
from raylog.replication.assignment import replica_log_dir
from raylog.testing.faults import kill_actor
from raylog.testing.host_checks import log_bytes_on
from raylog.testing.on_hosts import partition_state, read_values, wait

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]

#: flips one byte of the message at an offset of a log on the host that runs it
_FLIP = "import sys\nfrom raylog.testing.faults import flip_byte\nflip_byte(sys.argv[1], int(sys.argv[2]))\n"


def test_a_damaged_follower_mends_the_range_from_the_leader_on_another_host(hosts):
    client = hosts.client(cluster=f"mend-{uuid.uuid4().hex[:8]}")
    topic = f"m-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1, replication_factor=2, min_insync_replicas=2, flush_ms=5)
    producer = client.producer(acks="all")
    acked = [producer.send(topic, b"value-%03d" % i).result(60) for i in range(60)]
    producer.close()
    state = partition_state(client, topic)
    follower = next(n for n in state.replicas if n != state.leader)
    place = client.registry.placement(topic, 0)
    leader_host, follower_host = hosts.host(state.leader), hosts.host(follower)
    leader_dir = replica_log_dir(place["log_dir"], state.leader, state.origin)
    follower_dir = replica_log_dir(place["log_dir"], follower, state.origin)

    def same() -> bool:
        return log_bytes_on(follower_host, follower_dir) == log_bytes_on(leader_host, leader_dir)

    wait(lambda: same() and len(log_bytes_on(leader_host, leader_dir)) == client.offsets(topic, 0)[1],
         "the follower holds the leader's bytes")
    bad = acked[20][1]
    follower_host.python(_FLIP, follower_dir, str(bad))  # on the follower's own disk
    assert not same()
    actor = ray.get_actor(actor_name(client.settings.cluster, topic, 0) + "@" + follower, namespace=NAMESPACE)
    old_pid = kill_actor(actor)
    wait(same, "the follower mends its log from the leader")

    def stats():
        try:
            return ray.get(actor.stats.remote(), timeout=30)
        except ray.exceptions.RayError:
            return None

    wait(lambda: (s := stats()) is not None and s["pid"] != old_pid and s["mended"], "the restarted follower reports")
    s = stats()
    (report,) = s["recovery_reports"]
    assert report["start_offset"] == bad and report["end_offset"] > bad and report["kept"]  # found, rest kept
    assert s["mended"] == [{"start": report["start_offset"], "end": report["end_offset"], "from": state.leader}]
    assert read_values(client, topic, 60) == [b"value-%03d" % i for i in range(60)]
    client.delete_topic(topic)
    client.close()
