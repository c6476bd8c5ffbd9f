"""A rolling restart and a SIGTERM, on the hosts kit (:mod:`raylog.testing.hosts`:
disk hosts ``h2``-``h4``), while an ``acks="all"`` producer sends:

1. :meth:`raylog.Client.rolling_restart` restarts the raylog actors of every
   disk node in turn (drained first): no send fails, every replica is back in
   sync, and ``raylog topics balance-leaders`` (on the head host) hands the
   lead back to the preferred replica;
2. the leader's process stopped with SIGTERM (its node going down) hands its
   lead to an in-sync replica before it exits (Kafka's controlled shutdown):
   its own log says so, a new leader epoch leads, no send fails.

Every acknowledged message is read back exactly once, in order. Every wait
is bounded (a shared machine: generous); no time is asserted."""

from __future__ import annotations

import glob
import os
import signal
import uuid

import ray
import pytest

from raylog.replication.admin import leader_actor
from raylog.testing.clusters import wait_until
from raylog.testing.on_hosts import Sending, partition_state, read_values, replicated_topic, wait

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def client(hosts):
    return hosts.client(cluster=f"rolling-{uuid.uuid4().hex[:8]}")


def _in_sync(client, topic):
    state = partition_state(client, topic)
    return set(state.isr) == set(state.replicas)


def test_a_rolling_restart_and_a_sigterm_fail_no_send(hosts, client):
    topic = replicated_topic(client)
    first = partition_state(client, topic)
    wait(lambda: _in_sync(client, topic), "every replica in sync")
    sending = Sending(client, topic)
    try:
        sending.more_acked()
        rows = client.rolling_restart(timeout_s=180)
        assert sorted(r["node"] for r in rows) == sorted(h.name for h in hosts.disk_hosts)
        assert sum(r["leaders_moved"] for r in rows) >= 1
        assert _in_sync(client, topic)
        sending.more_acked()
        env = hosts._env()
        env["RAYLOG_TOKEN"] = client.settings.token.decode()
        proc = hosts.head.run([os.path.join(hosts.venv, "bin", "raylog"), "--zookeeper", hosts.zookeeper_address,
                               "--ray-address", hosts.ray_address, "--cluster", client.settings.cluster, "topics",
                               "balance-leaders", topic], check=False, timeout=300, env=env, cwd=hosts.tmp)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.splitlines()[0].split() == ["TOPIC", "PARTITION", "LEADER", "EPOCH"]
        assert partition_state(client, topic).leader == first.replicas[0]

        # SIGTERM to the leader's process: it hands off before it exits
        state = partition_state(client, topic)
        logs = os.path.join(hosts.host(state.leader).temp_dir, "ray", "session_*", "logs", "worker-*.err")

        def handed_off() -> int:  # the leader's host's log lines of a handoff of this partition
            return sum(open(p, errors="replace").read().count(f"{topic}-0: lead handed to") for p in glob.glob(logs))

        before = handed_off()
        _, actor = leader_actor(client._zk, client.registry, client.settings.cluster, topic, 0)
        pid = ray.get(actor.pid.remote(), timeout=60)
        os.kill(pid, signal.SIGTERM)
        wait(lambda: partition_state(client, topic).leader != state.leader, "another replica leads")
        assert partition_state(client, topic).leader_epoch == state.leader_epoch + 1
        if not wait_until(lambda: handed_off() > before, timeout_s=60):
            said = [line for p in glob.glob(logs) for line in open(p, errors="replace")
                    if f"{topic}-0" in line]
            pytest.fail("the stopped leader's log does not say it handed its lead off; "
                        f"its lines about the partition:\n{''.join(said[-20:])}")
        sending.more_acked()
        wait(lambda: _in_sync(client, topic), "the stopped replica, restarted by Ray, is in sync again")
    finally:
        sending.finish()
    assert sending.failures == []
    assert read_values(client, topic, len(sending.acked)) == sending.acked
