"""Consumers in groups, end to end: real ZooKeeper, real Ray, partition
actors, sockets. Failure cases first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import raylog
from raylog.errors import ConfigError, ZooKeeperUnavailableError
from raylog.testing.faults import expire_session

from consumer_helpers import wait_for

SESSION_MS = 3000


def _produce(client, topic: str, values: list[bytes], keyed: bool = True) -> None:
    import ray

    producer = client.producer(batch_size=50, acks=1)
    for v in values:
        producer.send(topic, v, key=v if keyed else None)
    producer.close()
    for p in range(client.metadata.partitions(topic)):
        ray.get(client.partition_actor(topic, p).flush.remote())


def _drain(consumers, want: set, timeout_s: float = 60.0) -> list:
    """Poll every consumer until the values seen cover ``want``."""
    seen: list = []
    deadline = time.monotonic() + timeout_s
    while not want <= {m.value for m in seen}:
        assert time.monotonic() < deadline, f"{len(want - {m.value for m in seen})} messages never arrived"
        for c in consumers:
            seen.extend(c.poll(timeout_ms=100))
    return seen


def _owners(client, group: str, topic: str) -> dict[int, str]:
    zk = client.registry.zk
    path = client.registry.paths.owners(group, topic)
    if not zk.exists(path):
        return {}
    return {int(p): zk.get(f"{path}/{p}")[0].decode() for p in zk.get_children(path)}


# -- errors ------------------------------------------------------------------


def test_group_consumers_refuse_assign_and_commit_needs_a_group(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    grouped = raylog_client.consumer(topic, group="g-errors", session_timeout_ms=SESSION_MS)
    try:
        with pytest.raises(ConfigError):
            grouped.assign([(topic, 0)])
    finally:
        grouped.close()
    plain = raylog_client.consumer(topic)
    with pytest.raises(ConfigError):
        plain.commit()
    plain.close()


def test_zookeeper_down_hands_out_nothing_new_and_the_group_recovers(private_zookeeper, ray_local, tmp_path, cluster_name):
    import ray

    client = raylog.Client(
        zookeeper=private_zookeeper.connect_string, cluster=cluster_name, data_dir=str(tmp_path), data_host="127.0.0.1"
    )
    try:
        client.create_topic("zk-down", partitions=2)
        consumer = client.consumer("zk-down", group="g", auto_offset_reset="earliest", session_timeout_ms=20_000)
        _produce(client, "zk-down", [b"before-%d" % i for i in range(50)])
        before = _drain([consumer], {b"before-%d" % i for i in range(50)})
        consumer.commit()

        private_zookeeper.kill_process()
        wait_for(lambda: not consumer._member.assignment, 30, "the consumer noticed ZooKeeper is gone")
        with pytest.raises(ZooKeeperUnavailableError):
            consumer.commit()
        # New data arrives while ZooKeeper is down (the data path does not need it) ...
        # (written straight to the partitions' data sockets: the producer looks
        # endpoints up in ZooKeeper, the actors' addresses come from Ray)
        from raylog.storage.message import encode_message_set
        from raylog.transfer.connection import BrokerConnection

        during = {b"during-%d" % i for i in range(50)}
        for p in range(2):
            actor = client.partition_actor("zk-down", p)
            host, port = ray.get(actor.address.remote())
            with BrokerConnection(host, port, token=client.settings.token, timeout_s=10) as conn:
                conn.produce("zk-down", p, encode_message_set(sorted(during)[p::2]), acks=1)
            ray.get(actor.flush.remote())
        # ... and the fetchers have it, but none of it is handed out: the
        # consumer cannot be sure it still owns the partitions.
        handed = []
        wait_for(lambda: consumer.queue.qsize() + len(consumer._pending) > 0, 30, "the fetchers to read new data",
                  polling=[consumer], sink=handed)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            handed += consumer.poll(timeout_ms=100)
        assert handed == []

        private_zookeeper.start()
        wait_for(lambda: len(consumer._member.assignment) == 2, 60, "the consumer rejoined", polling=[consumer],
                  sink=handed)
        after = handed + _drain([consumer], during - {m.value for m in handed})
        assert {m.value for m in after} >= during
        consumer.commit()
        assert {m.value for m in before} >= {b"before-%d" % i for i in range(50)}
        consumer.close()
    finally:
        if not private_zookeeper.running:
            private_zookeeper.start()
        for topic in client.list_topics():
            client.delete_topic(topic)
        client.close()


# -- groups ------------------------------------------------------------------------


def test_members_split_the_partitions_and_cover_the_topic(raylog_client, make_topic):
    topic = make_topic(partitions=6)
    consumers = [
        raylog_client.consumer(topic, group="g-split", auto_offset_reset="earliest", session_timeout_ms=SESSION_MS)
        for _ in range(3)
    ]
    try:
        wait_for(lambda: sorted(len(c.assignment()) for c in consumers) == [2, 2, 2], 30, "assignment settled",
                  polling=consumers)
        assignments = [c.assignment() for c in consumers]
        assert all(len(a) == 2 for a in assignments)
        assert frozenset().union(*assignments) == {(topic, p) for p in range(6)}
        owners = _owners(raylog_client, "g-split", topic)
        assert sorted(owners) == list(range(6))
        for c in consumers:
            mine = {p for (_, p) in c.assignment()}
            assert {p for p, owner in owners.items() if owner == c._member.consumer_id} == mine

        values = [b"v-%d" % i for i in range(600)]
        _produce(raylog_client, topic, values)
        seen = _drain(consumers, set(values))
        assert len(seen) == len(values)  # nothing twice without a rebalance

        for c in consumers:
            c.commit()
        rows = [r for r in raylog_client.describe_group("g-split") if r["topic"] == topic]
        assert sorted(r["partition"] for r in rows) == list(range(6))
        assert all(r["lag_bytes"] == 0 and r["lag_messages"] == 0 and r["lag_messages_estimate"] == 0 for r in rows)
        assert "g-split" in raylog_client.list_groups()
    finally:
        for c in consumers:
            c.close()


def test_two_groups_each_receive_the_whole_feed(raylog_client, make_topic):
    topic = make_topic(partitions=3)
    a = raylog_client.consumer(topic, group="g-a", auto_offset_reset="earliest", session_timeout_ms=SESSION_MS)
    b = raylog_client.consumer(topic, group="g-b", auto_offset_reset="earliest", session_timeout_ms=SESSION_MS)
    try:
        values = [b"feed-%d" % i for i in range(300)]
        _produce(raylog_client, topic, values)
        assert sorted(m.value for m in _drain([a], set(values))) == sorted(values)
        assert sorted(m.value for m in _drain([b], set(values))) == sorted(values)
    finally:
        a.close()
        b.close()


def test_join_and_leave_skip_no_message(raylog_client, make_topic):
    topic = make_topic(partitions=4)
    group = "g-churn"
    opts = dict(group=group, auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, auto_commit_interval_ms=200)
    first = raylog_client.consumer(topic, **opts)
    seen: list = []
    batch1 = [b"one-%d" % i for i in range(400)]
    _produce(raylog_client, topic, batch1)
    seen += first.poll(timeout_ms=2000, max_messages=150)  # part of it, then a member joins

    second = raylog_client.consumer(topic, **opts)
    wait_for(lambda: len(first.assignment()) == 2 and len(second.assignment()) == 2, 30, "join rebalanced",
              polling=[first, second], sink=seen)
    batch2 = [b"two-%d" % i for i in range(400)]
    _produce(raylog_client, topic, batch2)
    seen += _drain([first, second], (set(batch1) | set(batch2)) - {m.value for m in seen})

    first.close()  # leaves: its partitions move to the second, from the committed offsets
    wait_for(lambda: len(second.assignment()) == 4, 30, "leave rebalanced", polling=[second], sink=seen)
    batch3 = [b"three-%d" % i for i in range(400)]
    _produce(raylog_client, topic, batch3)
    seen += _drain([second], set(batch3))
    second.close()

    # every produced message was consumed at least once
    assert {m.value for m in seen} >= set(batch1) | set(batch2) | set(batch3)


def test_eight_consumers_started_at_once_converge(raylog_client, make_topic):
    topic = make_topic(partitions=16)
    consumers: list = []
    lock = threading.Lock()

    def start():
        c = raylog_client.consumer(topic, group="g-eight", session_timeout_ms=SESSION_MS)
        with lock:
            consumers.append(c)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert len(consumers) == 8

        def settled():
            parts = [c.assignment() for c in consumers]
            return sum(len(p) for p in parts) == 16 and all(len(p) == 2 for p in parts)

        wait_for(settled, 60, "eight consumers settled", polling=consumers)
        everything = [tp for c in consumers for tp in c.assignment()]
        assert len(everything) == len(set(everything)) == 16
        assert sorted(_owners(raylog_client, "g-eight", topic)) == list(range(16))
    finally:
        for c in consumers:
            c.close()


def test_session_expiry_rejoins_and_keeps_consuming(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    consumer = raylog_client.consumer(topic, group="g-expire", auto_offset_reset="earliest", session_timeout_ms=SESSION_MS)
    try:
        _produce(raylog_client, topic, [b"a-%d" % i for i in range(100)])
        _drain([consumer], {b"a-%d" % i for i in range(100)})
        consumer.commit()
        expire_session(consumer._group_zk)
        wait_for(lambda: len(consumer.assignment()) == 2 and len(consumer._member.assignment) == 2, 60, "rejoined",
                  polling=[consumer])
        assert sorted(_owners(raylog_client, "g-expire", topic)) == [0, 1]
        _produce(raylog_client, topic, [b"b-%d" % i for i in range(100)])
        _drain([consumer], {b"b-%d" % i for i in range(100)})
    finally:
        consumer.close()


def test_killed_consumer_process_partitions_move_after_session_timeout(raylog_client, make_topic, tmp_path):
    topic = make_topic(partitions=4)
    values = [b"k-%d" % i for i in range(400)]
    _produce(raylog_client, topic, values)
    out = tmp_path / "seen.txt"
    script = textwrap.dedent(
        """
        import sys
        from raylog.consumer import Consumer
        from raylog.metadata import ConnectionSettings, Metadata
        zookeeper, cluster, topic, out = sys.argv[1:5]
        metadata = Metadata.connect(ConnectionSettings(zookeeper=zookeeper, cluster=cluster))
        consumer = Consumer(metadata, topic, group="g-kill", auto_offset_reset="earliest",
                            session_timeout_ms=%d, auto_commit_interval_ms=100)
        with open(out, "ab", buffering=0) as f:
            f.write(b"ready\\n")
            while True:
                for m in consumer.poll(timeout_ms=200, max_messages=20):
                    f.write(m.value + b"\\n")
        """
        % SESSION_MS
    )
    settings = raylog_client.settings
    proc = subprocess.Popen([sys.executable, "-c", script, settings.zookeeper, settings.cluster, topic, str(out)])
    try:
        wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") > 150, 90, "the child consumed")
        other = raylog_client.consumer(topic, group="g-kill", auto_offset_reset="earliest", session_timeout_ms=SESSION_MS)
        early = []
        wait_for(lambda: len(other.assignment()) == 2, 60, "the group split between two members",
                  polling=[other], sink=early)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        wait_for(lambda: len(other.assignment()) == 4, 60, "the killed member's partitions moved",
                  polling=[other], sink=early)
        more = [b"k2-%d" % i for i in range(100)]
        _produce(raylog_client, topic, more)
        child_seen = set(out.read_bytes().split(b"\n"))
        got = early + _drain([other], (set(values) - child_seen - {m.value for m in early}) | set(more))
        assert (child_seen | {m.value for m in got}) >= set(values) | set(more)
        other.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
