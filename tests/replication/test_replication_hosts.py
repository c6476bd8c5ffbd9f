"""Replication across real hosts (the hosts kit, :mod:`raylog.testing.hosts`:
the head host runs ZooKeeper and the Ray head, disk hosts ``h2``-``h4`` each
have an address, a Ray node and a disk of their own; this process is the
client machine):

* replicas on three hosts, followers with byte-identical logs (each read on
  its own host's disk), ``acks="all"`` through the ISR, and
  ``NotEnoughReplicasError`` below ``min_insync_replicas`` with the data
  already accepted intact; the replication example of docs/howto/replication.md as written;
* the leader's host lost (every process on it killed): an ISR member takes
  over (leader epoch + 1), nothing acknowledged is lost, a set whose ack was
  lost with the leader is stored once (the followers keep the idempotent
  producers' sequences); the host comes back on its disk, the old leader
  truncates to the new epoch and rejoins;
* a follower whose host is lost and comes back on the same disk catches up
  and rejoins the ISR (also after the leader's retention passed its log
  end); ``raylog topics describe`` shows the gap and its end.

Every host a test cuts or kills is whole again when the test ends (the
hosts cluster is shared by the session). Every wait is bounded by a
generous deadline of the test's own; no time is asserted.
"""

from __future__ import annotations

import os
import uuid

import pytest

from raylog.errors import ConfigError, NotEnoughReplicasError, RaylogError
from raylog.retry import RetryPolicy
from raylog.testing import faults
from raylog.testing.host_checks import heal_host, log_bytes_on, paths_on
from raylog.testing.on_hosts import bring_back, partition_state, read_values, replicated_topic, wait
from tests.doc_blocks import block

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(1800)]

DISK_HOSTS = ["h2", "h3", "h4"]


@pytest.fixture(scope="module")
def client(hosts):
    return hosts.client(cluster=f"replication-{uuid.uuid4().hex[:8]}")


def _replica_dirs(client, topic: str) -> dict[str, str]:
    """``{node: log dir}`` of the partition's replicas (each on its node's host)."""
    from raylog.replication.assignment import replica_log_dir

    state = partition_state(client, topic)
    place = client.registry.placement(topic, 0)
    return {node: replica_log_dir(place["log_dir"], node, state.origin) for node in state.replicas}


def _logs(hosts, dirs: dict[str, str]) -> dict[str, bytes]:
    """Each replica's log, read on its own host's disk."""
    return {node: log_bytes_on(hosts.host(node), d) for node, d in dirs.items()}


def _readme_example() -> str:
    """The replication example of docs/howto/replication.md, as written."""
    return block("docs/howto/replication.md", "Replication")


def test_replicas_on_three_hosts_acks_all_and_not_enough_replicas(hosts, client):
    with pytest.raises(ConfigError) as too_many:
        client.create_topic("toomany", replication_factor=4)
    assert "replication_factor 4" in str(too_many.value) and not too_many.value.retriable
    assert "toomany" not in client.list_topics()

    # the replication example of docs/howto/replication.md, as written
    exec(_readme_example(), {"client": client})
    assert [(len(p["replicas"]), len(p["isr"])) for p in client.describe_topic("payments")["partitions"]] == [(3, 3)] * 4
    client.delete_topic("payments")

    topic = replicated_topic(client, replica_lag_ms=1500)
    producer = client.producer(acks="all")
    acked = [producer.send(topic, b"v%d" % i).result(60) for i in range(200)]
    assert len(acked) == 200
    row = client.describe_topic(topic)["partitions"][0]
    assert row["leader_epoch"] == 0 and row["leader"] == row["replicas"][0]
    assert sorted(row["replicas"]) == DISK_HOSTS
    assert sorted(row["isr"]) == DISK_HOSTS and not row["under_replicated"]
    wait(lambda: set(client.describe_topic(topic)["partitions"][0]["replica_log_end_offsets"].values())
         == {client.offsets(topic, 0)[1]}, "every replica at the leader's log end")
    # the same bytes at the same offsets, each replica on its own host's disk
    logs = _logs(hosts, _replica_dirs(client, topic))
    assert len(logs) == 3 and len(set(logs.values())) == 1, {n: len(b) for n, b in logs.items()}
    assert len(logs[row["leader"]]) == client.offsets(topic, 0)[1] > 0

    followers = [hosts.host(n) for n in row["replicas"] if n != row["leader"]]
    cut = []
    try:
        # One follower's host is cut off: after replica_lag_ms the ISR shrinks to 2 and acks=all goes on.
        faults.cut_host(followers[0])
        cut.append(followers[0])
        more = [producer.send(topic, b"w%d" % i).result(60) for i in range(50)]
        assert len(more) == 50
        wait(lambda: len(partition_state(client, topic).isr) == 2, "the ISR shrinks to 2")
        # The second follower's host too: below min_insync_replicas acks=all fails, retriable.
        faults.cut_host(followers[1])
        cut.append(followers[1])
        wait(lambda: partition_state(client, topic).isr == (row["leader"],), "the ISR is the leader alone")
        strict = client.producer(acks="all", retry=RetryPolicy(max_tries=2, delay_s=0.1, deadline_s=10))
        with pytest.raises(NotEnoughReplicasError) as refused:
            strict.send(topic, b"refused").result(60)
        assert refused.value.retriable
        try:
            strict.close()  # its refused message is reported once more
        except RaylogError:
            pass
        ones = client.producer(acks=1)
        ones.send(topic, b"acks1").result(60)  # acks=1 still works on the leader
        ones.close()
        # what was accepted is intact (the high watermark is the leader's own log end now)
        seen = read_values(client, topic, 251)
        assert seen[:250] == [b"v%d" % i for i in range(200)] + [b"w%d" % i for i in range(50)], len(seen)
    finally:
        for host in cut:
            heal_host(hosts, host)
    # back, the followers catch up and rejoin the ISR; the acks=1 message stays, the refused one was never stored
    wait(lambda: len(partition_state(client, topic).isr) == 3, "the followers rejoin the ISR")
    producer.close()
    assert read_values(client, topic, 251)[250:] == [b"acks1"]
    client.delete_topic(topic)


def test_leader_host_lost_an_isr_member_takes_over_and_nothing_acknowledged_is_lost(hosts, client):
    import ray

    from raylog.actors.partition import actor_name
    from raylog.config import NAMESPACE
    from raylog.replication.assignment import replica_actor_name

    topic = replicated_topic(client, replica_lag_ms=5000)
    producer = client.producer(acks="all", retry=RetryPolicy(max_tries=200, delay_s=0.2, max_delay_s=1.0,
                                                              deadline_s=90))
    acked = [producer.send(topic, b"v%d" % i).result(60) for i in range(100)]
    wait(lambda: len(partition_state(client, topic).isr) == 3, "the ISR is whole")
    before = client.describe_topic(topic)["partitions"][0]
    dirs = _replica_dirs(client, topic)

    # One follower stalls (SIGSTOP): the leader appends v100 and the other follower (the keeper)
    # replicates it, but acks="all" waits for the stalled ISR member, so v100's ack is still owed
    # when the leader's host is lost. The producer retries v100 at the keeper, which must answer
    # it as a duplicate (the sequences were replicated with the bytes), not store it again.
    first = before["replicas"][0]
    keeper, stalled = [n for n in before["replicas"] if n != before["leader"]]
    stalled_actor = ray.get_actor(replica_actor_name(actor_name(client.settings.cluster, topic, 0), stalled, first),
                                  namespace=NAMESPACE)
    stalled_pid = ray.get(stalled_actor.pid.remote(), timeout=60)
    leader_host, keeper_host = hosts.host(before["leader"]), hosts.host(keeper)
    try:
        faults.stop_process(stalled_pid)
        size = len(log_bytes_on(keeper_host, dirs[keeper]))
        pending = producer.send(topic, b"v100")
        wait(lambda: len(log_bytes_on(keeper_host, dirs[keeper])) > size, "the keeper replicates v100")
        assert not pending.done()  # v100 is on the keeper, its ack still owed
        faults.kill_host(leader_host)  # a lost host takes all its processes at once
        wait(lambda: partition_state(client, topic).leader == keeper, "the keeper leads")
    finally:
        faults.resume_process(stalled_pid)
    try:
        acked.append(pending.result(120))
        acked += [producer.send(topic, b"v%d" % i).result(120) for i in range(101, 200)]
        after = client.describe_topic(topic)["partitions"][0]
        assert after["leader"] != before["leader"] and after["leader_epoch"] == 1
        assert after["node"] == after["leader"]  # describe's node: the one serving now, not the first leader's
        assert all(a[1] < b[1] for a, b in zip(acked, acked[1:]))
        seen = read_values(client, topic, 200)
        first_seen = list(dict.fromkeys(seen))  # each value at its first appearance
        assert first_seen == [b"v%d" % i for i in range(200)], len(seen)  # nothing acknowledged is lost
        # Followers keep the idempotent producers' sequences: a set retried across the failover is stored once.
        assert seen == [b"v%d" % i for i in range(200)], f"{len(seen)} messages for 200"
        # the two surviving replicas hold the same bytes, each on its own host
        survivors = {n: d for n, d in dirs.items() if n != before["leader"]}
        wait(lambda: len(set(_logs(hosts, survivors).values())) == 1, "the two survivors hold the same bytes")
        assert len(survivors) == 2
    finally:
        # The old leader's host comes back on its disk: it follows, truncated to the new epoch, and rejoins.
        bring_back(hosts, leader_host)
    wait(lambda: len(partition_state(client, topic).isr) == 3, "the old leader rejoins the ISR")
    assert sorted(client.describe_topic(topic)["partitions"][0]["isr"]) == DISK_HOSTS
    logs = wait(lambda: len(set((found := _logs(hosts, dirs)).values())) == 1 and found, "every replica identical")
    assert len(logs) == 3 and len(logs[before["leader"]]) == client.offsets(topic, 0)[1]
    producer.close()
    client.delete_topic(topic)


def _describe_cli(hosts, client, topic: str) -> tuple[int, list[str], str]:
    """``raylog topics describe`` run on the head host (a node of the cluster)
    from the hosts' installed raylog: (exit code, stdout lines, stderr)."""
    env = {k: v for k, v in hosts._env().items() if not k.startswith("RAYLOG_")}
    env["RAYLOG_TOKEN"] = client.settings.token.decode()  # this cluster's, as from outside Ray
    proc = hosts.head.run(
        [os.path.join(hosts.venv, "bin", "raylog"), "--zookeeper", hosts.zookeeper_address,
         "--ray-address", hosts.ray_address, "--cluster", client.settings.cluster, "topics", "describe", topic],
        check=False, timeout=300, env=env, cwd=hosts.tmp)
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


def test_a_follower_whose_host_returns_catches_up_and_rejoins_the_isr(hosts, client):
    topic = replicated_topic(client, replica_lag_ms=1500)
    producer = client.producer(acks="all")
    acked = [producer.send(topic, b"v%d" % i).result(60) for i in range(100)]
    wait(lambda: len(partition_state(client, topic).isr) == 3, "the ISR is whole")
    before = client.describe_topic(topic)["partitions"][0]
    # "k" deletes old segments by size: while a follower is away its leader's log start passes the
    # follower's log end, and the follower must start over there when it is back.
    k = replicated_topic(client, replica_lag_ms=1500, segment_bytes=1024, max_message_bytes=1024, retention_bytes=1024,
               retention_check_ms=200)
    for i in range(60):
        producer.send(k, b"k%03d" % i).result(60)
    wait(lambda: len(partition_state(client, k).isr) == 3, "k's ISR is whole")
    k_before = client.describe_topic(k)["partitions"][0]
    gone = [n for n in before["replicas"] if n != before["leader"] and n != k_before["leader"]][0]
    k_dir = _replica_dirs(client, k)[gone]
    k_gone_end = client.offsets(k, 0)[1]
    host = hosts.host(gone)
    faults.kill_host(host)  # a lost host takes all its processes: the follower's too, at once
    try:
        wait(lambda: gone not in partition_state(client, topic).isr, f"{gone} leaves the ISR")
        acked += [producer.send(topic, b"w%d" % i).result(60) for i in range(100)]
        assert len(acked) == 200
        gone_end = client.offsets(topic, 0)[1]
        i = 60
        while client.offsets(k, 0)[0] <= k_gone_end and i < 2000:
            producer.send(k, b"k%03d" % i).result(60)
            i += 1
        leader_start = client.offsets(k, 0)[0]
        assert leader_start > k_gone_end  # the leader's retention passed the follower's log end
        cli_gone = _describe_cli(hosts, client, topic)
    finally:
        # The host comes back on the same disk: the follower recovers its log, catches up and rejoins.
        bring_back(hosts, host)
    wait(lambda: gone in partition_state(client, topic).isr, f"{gone} rejoins the ISR")
    after = client.describe_topic(topic)["partitions"][0]
    # the follower's loss changed no leadership (epoch 0 unless the first leader was slow to start)
    assert after["leader"] == before["leader"] and after["leader_epoch"] == before["leader_epoch"]
    assert sorted(after["isr"]) == DISK_HOSTS and not after["under_replicated"]
    end = client.offsets(topic, 0)[1]
    logs = wait(lambda: len(set((found := _logs(hosts, _replica_dirs(client, topic))).values())) == 1 and found,
                "every replica identical")
    assert len(logs) == 3 and len(logs[gone]) == end

    # `raylog topics describe` shows the leader, epoch, replicas, ISR and log ends, and marks the gap.
    code, lines, err = cli_gone
    assert code == 0, err
    assert "replication_factor: 3  min_insync_replicas: 2" in lines[0]
    columns, row = lines[-2].split(), lines[-1].split()
    assert columns == ["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "REPLICA_LOG_ENDS", "REPLICATION"]
    leader = before["leader"]
    assert row[:3] == ["0", leader, str(before["leader_epoch"])] and sorted(row[3].split(",")) == DISK_HOSTS
    assert sorted(set(DISK_HOSTS) - set(row[4].split(","))) == [gone]
    assert row[6] == "UNDER-REPLICATED" and "1 of 1 partitions under-replicated" in err
    ends = dict(pair.split("=") for pair in row[5].split(","))
    assert ends[gone] == "-" and ends[leader] == str(gone_end)
    code, lines, err = _describe_cli(hosts, client, topic)
    assert code == 0, err
    row = lines[-1].split()
    assert sorted(row[4].split(",")) == DISK_HOSTS and row[6] == "ok"
    assert set(dict(pair.split("=") for pair in row[5].split(",")).values()) == {str(end)}

    # Back after the leader's retention passed its log end: the follower starts over at the leader's log start.
    wait(lambda: gone in partition_state(client, k).isr, f"{gone} rejoins k's ISR")
    wait(lambda: len(set(client.describe_topic(k)["partitions"][0]["replica_log_end_offsets"].values())) == 1,
         "every replica of k at one log end")
    segments = paths_on(host, os.path.join(k_dir, "*.log"))
    assert segments and min(int(os.path.basename(s)[:-4]) for s in segments) > k_gone_end
    producer.close()
    client.delete_topic(topic)
    client.delete_topic(k)
