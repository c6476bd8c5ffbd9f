"""Leaders moved on purpose, on the hosts kit (:mod:`raylog.testing.hosts`:
disk hosts ``h2``-``h4``): a handoff, a preferred-leader balance and a
drain, while an ``acks="all"`` producer sends. No send fails, every
acknowledged message is read exactly once and in order, each move takes a
new leader epoch, and the drained node leads nothing and is in no ISR.
Every wait is bounded (a shared machine: generous); no time is asserted."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from raylog.errors import HandoffError
from raylog.testing.on_hosts import Sending, partition_state, read_values, replicated_topic, wait

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def client(hosts):
    return hosts.client(cluster=f"handoff-{uuid.uuid4().hex[:8]}")


def _on_head(hosts, client, *args):
    """``raylog ARGS`` on the head host, as an operator runs it (the client's cluster and token)."""
    env = hosts._env()
    env["RAYLOG_TOKEN"] = client.settings.token.decode()
    return hosts.head.run([os.path.join(hosts.venv, "bin", "raylog"), "--zookeeper", hosts.zookeeper_address,
                           "--ray-address", hosts.ray_address, "--cluster", client.settings.cluster, *args],
                          check=False, timeout=300, env=env, cwd=hosts.tmp)


def test_handoff_balance_and_drain_under_an_acks_all_producer(hosts, client):
    topic = replicated_topic(client)
    first = partition_state(client, topic)
    wait(lambda: set(partition_state(client, topic).isr) == set(first.replicas), "every replica in sync")
    sending = Sending(client, topic)
    try:
        sending.more_acked()
        # a replica out of sync (none here) or the leader itself: refused, nothing changed
        with pytest.raises(HandoffError):
            client.hand_off(topic, 0, first.leader)
        target = first.replicas[1]
        moved = client.hand_off(topic, 0, target, timeout_s=30)
        state = partition_state(client, topic)
        assert (state.leader, state.leader_epoch) == (target, first.leader_epoch + 1)
        assert moved["leaderless_s"] is not None
        sending.more_acked()

        # back to the preferred replica (the first), on demand
        wait(lambda: first.replicas[0] in partition_state(client, topic).isr, "the old leader follows, in sync")
        balanced = client.balance_leaders([topic], timeout_s=30)
        assert [m["leader"] for m in balanced["moved"]] == [first.replicas[0]], balanced
        assert balanced["leaders_after"][first.replicas[0]] == 1
        assert partition_state(client, topic).leader == first.replicas[0]
        sending.more_acked()

        # drain the leader's node: it leads nothing and is in no ISR, and sends go on
        node = first.replicas[0]
        wait(lambda: set(partition_state(client, topic).isr) == set(first.replicas), "every replica in sync")
        proc = _on_head(hosts, client, "nodes", "drain", node, "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        assert report["can_stop"] and report["blocked"] == [], report
        assert len(report["leaders_moved"]) == 1 and len(report["followers_shed"]) == 1, report
        state = partition_state(client, topic)
        assert state.leader != node and node not in state.isr and len(state.isr) == 2
        sending.more_acked()
    finally:
        sending.finish()
    assert sending.failures == []
    assert read_values(client, topic, len(sending.acked)) == sending.acked
