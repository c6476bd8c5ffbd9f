"""Replica reassignment and the supervisor's care of replicas across real
network boundaries, on the hosts kit (:mod:`raylog.testing.hosts`: disk
hosts ``h2``-``h4``, each with an address, a Ray node and a disk of its own;
ZooKeeper and the Ray head on the head host; this process is the client
machine). One topic (RF 2 over three disk hosts, so one host is spare), the
scenarios following each other:

1. a reassignment refused (not replicated, a node not alive, a node twice)
   changes nothing;
2. reassigning to the spare host and the follower, while an ``acks="all"``
   producer sends: the lead moves to a target replica (a new leader epoch),
   every acknowledged message is read exactly once and in order, the new
   replica's log on its host's disk is byte-identical to the leader's on
   its host's up to the high watermark, and the old leader's actor is
   stopped and its log gone from its host's disk;
3. every replica actor killed (a cluster restart as the logs and ZooKeeper
   see it): one repair pass starts the leader and the follower, which
   catches up, so that ``acks="all"`` goes on;
4. a follower's host lost (every process of it killed; its disk stays):
   after the topic's ``replica_replace_after_s`` the supervisor moves that
   replica to the spare host; when the lost host returns, its old log is
   removed from its disk;
5. ``raylog topics reassign --replace``, run on the head host as an
   operator would, moves it back to the returned host.

Every wait is bounded by a generous deadline of the test's own (the machine
is shared); no time is asserted.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from raylog.errors import InvalidReassignmentError
from raylog.retry import RetryPolicy
from raylog.testing import faults
from raylog.testing.clusters import wait_until
from raylog.testing.host_checks import exists_on, heal_host, log_bytes_on, paths_on

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(1800)]

#: the test's own bound on every wait (a loaded machine: generous)
WAIT_S = 180.0


def _wait(check, what: str, timeout_s: float = WAIT_S) -> None:
    assert wait_until(check, timeout_s), f"not within {timeout_s} s: {what}"


class Sender:
    """An ``acks="all"`` producer on a thread of its own; ``acked`` holds
    ``(value, offset)`` per acknowledged message, in send order."""

    def __init__(self, client, topic: str):
        self.topic = topic
        self.producer = client.producer(acks="all", retry=RetryPolicy(max_tries=300, delay_s=0.1, max_delay_s=1.0,
                                                                       deadline_s=90))
        self.acked: list[tuple[bytes, int]] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def produce(self, prefix: bytes, limit: int) -> None:
        try:
            for i in range(limit):
                if self.stop.is_set():
                    return
                value = b"%s%d" % (prefix, i)
                self.acked.append((value, self.producer.send(self.topic, value).result(120)[1]))
        except Exception as err:  # noqa: BLE001 - reported by the test
            self.failures.append(repr(err))

    def in_background(self, prefix: bytes, limit: int) -> threading.Thread:
        thread = threading.Thread(target=self.produce, args=(prefix, limit), daemon=True)
        thread.start()
        return thread


def test_reassign_restart_and_replace_a_lost_replica_across_hosts(hosts):
    import ray

    from raylog.actors.partition import actor_name
    from raylog.actors.supervisor import repair
    from raylog.config import NAMESPACE
    from raylog.replication.assignment import replica_actor_name, replica_log_dir
    from raylog.replication.state import read_state

    client = hosts.client(cluster=f"reassign-{uuid.uuid4().hex[:8]}")
    topic = "m"
    client.create_topic(topic, replication_factor=2, min_insync_replicas=2, replica_lag_ms=1500, flush_ms=5,
                        replica_replace_after_s=3)
    client.create_topic("single")
    zk, paths = client.registry.zk, client.registry.paths

    def state():
        return read_state(zk, paths, topic, 0)[0]

    plain, plain_dir = actor_name(client.settings.cluster, topic, 0), client.registry.placement(topic, 0)["log_dir"]
    before = state()

    def actor_of(node):
        return ray.get_actor(replica_actor_name(plain, node, before.origin), namespace=NAMESPACE)

    def dir_of(node):
        return replica_log_dir(plain_dir, node, before.origin)

    disk = [h.name for h in hosts.disk_hosts]
    assert len(disk) == 3 and len(before.replicas) == 2
    spare = next(n for n in disk if n not in before.replicas)
    old_leader = before.leader
    target = [spare] + [n for n in before.replicas if n != old_leader]

    # 1. refused: not replicated, a node that is not alive, a node twice; nothing changes
    for args in (("single", 0, ["h2"]), (topic, 0, [spare, "h9"]), (topic, 0, [spare, spare])):
        with pytest.raises(InvalidReassignmentError):
            client.reassign_partition(*args, timeout_s=10)
    assert state() == before

    # 2. reassigned while an acks="all" producer sends: the lead moves to a target replica
    sender = Sender(client, topic)
    thread = sender.in_background(b"v", 5000)
    _wait(lambda: len(sender.acked) >= 50 or sender.failures, "50 messages acknowledged")
    result = client.reassign_partition(topic, 0, target, timeout_s=150)
    at = len(sender.acked)
    _wait(lambda: len(sender.acked) >= at + 50 or sender.failures, "50 more acknowledged after the move")
    sender.stop.set()
    thread.join(150)
    assert not sender.failures and at >= 50 and len(sender.acked) >= at + 50, sender.failures
    # the lead moved (a new epoch); a loaded machine may add a failover of its own (a session expiring)
    assert result["leader_epoch"] >= before.leader_epoch + 1 and result["leader"] in target
    assert sorted(result["replicas"]) == sorted(target) == sorted(result["isr"])
    with pytest.raises(ValueError):
        actor_of(old_leader)  # stopped
    old_host = hosts.host(old_leader)
    assert not exists_on(old_host, dir_of(old_leader)), f"the old leader's log is still on {old_leader}'s disk"
    leader = state().leader
    hw = client.offsets(topic, 0)[1]
    assert hw > 0

    def identical_to_hw():
        moved = log_bytes_on(hosts.host(spare), dir_of(spare))
        return len(moved) >= hw and moved[:hw] == log_bytes_on(hosts.host(leader), dir_of(leader))[:hw]

    _wait(identical_to_hw, f"{spare}'s log byte-identical to the leader's ({leader}) up to the high watermark")

    # 3. every replica actor killed (a cluster restart as the logs see it): one repair pass starts them all
    pids = [faults.actor_pid(actor_of(n)) for n in target]
    for n in target:
        ray.kill(actor_of(n), no_restart=True)
    _wait(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), "the replica actors gone")
    rows = repair(client.registry, client.settings.zookeeper, topic=topic, host=client.data_host,
                  token=client.settings.token)
    states = {r["node"]: r["state"] for r in rows if r["topic"] == topic}
    assert sorted(states) == sorted(target) and set(states.values()) == {"started"}, rows
    sender.stop.clear()
    sender.produce(b"w", 30)
    assert not sender.failures, sender.failures
    _wait(lambda: len(set(client.describe_topic(topic)["partitions"][0]["replica_log_end_offsets"].values())) == 1
          and sorted(state().isr) == sorted(target), "the follower caught up and in the ISR")

    # 4. a follower's host lost: the supervisor moves its replica to the spare host (the old leader's)
    client.start_supervisor(interval_s=2)
    victim = next(n for n in target if n != state().leader)
    victim_host = hosts.host(victim)
    faults.kill_host(victim_host)
    try:
        _wait(lambda: victim not in (s := state()).replicas and old_leader in s.isr and len(s.isr) == 2,
              f"the supervisor moves {victim}'s replica to {old_leader}")
        after_replace = sorted(state().replicas)
        sender.produce(b"x", 30)
        assert not sender.failures, sender.failures
        assert exists_on(victim_host, dir_of(victim))  # the lost host's disk still holds its old log ...
    finally:
        heal_host(hosts, victim_host)  # ... until it is back
    _wait(lambda: not exists_on(victim_host, dir_of(victim)), f"the old log removed from {victim}'s disk")

    # 5. on the command line, on the head host: the replica goes back to the returned host
    env = hosts._env()  # the nodes' own Ray auth mode
    env["RAYLOG_TOKEN"] = client.settings.token.decode()  # this cluster's, as from outside Ray
    proc = hosts.head.run(
        [os.path.join(hosts.venv, "bin", "raylog"), "--zookeeper", hosts.zookeeper_address, "--ray-address",
         hosts.ray_address, "--cluster", client.settings.cluster, "topics", "reassign", topic, "--replace",
         f"{old_leader}={victim}"], check=False, timeout=300, env=env, cwd=hosts.tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR"]
    replicas = sorted(state().replicas)
    assert sorted(lines[1].split()[3].split(",")) == replicas == sorted(state().isr)
    assert victim in replicas and old_leader not in replicas and replicas != after_replace
    sender.produce(b"y", 30)
    assert not sender.failures, sender.failures
    sender.producer.close()

    # every acknowledged message read exactly once and in order
    consumer = client.consumer([topic], group="g", auto_offset_reset="earliest")
    seen, deadline = [], time.monotonic() + WAIT_S
    while len(seen) < len(sender.acked) and time.monotonic() < deadline:
        seen += [m.value for m in consumer.poll(timeout_ms=500)]
    seen += [m.value for m in consumer.poll(timeout_ms=1000)]
    consumer.close()
    assert seen == [v for v, _ in sender.acked], (len(seen), len(sender.acked))
    assert all(a[1] < b[1] for a, b in zip(sender.acked, sender.acked[1:]))

    client.delete_topic(topic)
    client.delete_topic("single")
    for host in hosts.disk_hosts:
        assert paths_on(host, plain_dir + "*") == [], host.name
