"""The partition actor heals and stays bounded, through real Ray and real
ZooKeeper: a retried idempotent set is stored once across a SIGKILL, an
injected fsync failure restarts the actor with the accepted data intact, a
zstd bomb is refused while the partition keeps serving, a quiet partition's
old data ages out (segment_ms), and two clusters sharing a data directory
keep out of each other's files."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid

import pytest

from raylog.transfer.handshake import authenticate_socket
from raylog.errors import InflatedSizeTooLargeError, RaylogError
from raylog.storage import faults
from raylog.storage.compression import CODEC_ZSTD, compress
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message, encode_message_set
from raylog.transfer import protocol as p
from raylog.transfer import replies as rep
from raylog.transfer import requests as req
from raylog.transfer.connection import BrokerConnection


def wait_for(predicate, timeout_s: float, what: str):
    from ray.exceptions import RayError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (RaylogError, RayError, OSError):  # the actor is restarting
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.1)


def token_of(client):
    return client.settings.token


def connection(client, topic: str) -> BrokerConnection:
    host, port = client.metadata.endpoint(topic, 0, refresh=True)
    return BrokerConnection(host, port, token=token_of(client), timeout_s=10)


def read_all(client, topic: str) -> list[bytes]:
    import ray

    actor = client.partition_actor(topic, 0)
    wait_for(lambda: ray.get(actor.flush.remote(), timeout=10) is not None, 60, "flush")
    start, end = wait_for(lambda: ray.get(actor.offsets.remote(), timeout=10), 60, "offsets")
    values = []
    with connection(client, topic) as conn:
        offset = start
        while offset < end:
            result = conn.fetch(topic, 0, offset, 1 << 20)
            records, consumed = decode_messages(result.data, offset)
            values.extend(r[3] for r in records)
            offset += consumed
    return values


def restarted(actor, old_pid: int, timeout_s: float = 120):
    import ray

    return wait_for(
        lambda: (lambda s: s if s["pid"] != old_pid else None)(ray.get(actor.stats.remote(), timeout=10)),
        timeout_s,
        "the partition actor restarted",
    )


class Raw:
    """PRODUCE version 1 frames over a plain socket (authenticated)."""

    def __init__(self, client, topic: str):
        host, port = client.metadata.endpoint(topic, 0, refresh=True)
        self.sock = socket.create_connection((host, port), timeout=20)
        self.topic = topic
        self.correlation = 0
        token = token_of(client)
        if token is not None:
            authenticate_socket(self.sock, token)

    def reply(self):
        def exactly(n):
            data = b""
            while len(data) < n:
                chunk = self.sock.recv(n - len(data))
                if not chunk:
                    raise EOFError("closed")
                data += chunk
            return data

        (size,) = p.SIZE.unpack(exactly(4))
        rest = exactly(size)
        correlation_id, code = p.REPLY_HEADER.unpack(p.SIZE.pack(size) + rest[:6])[1:]
        return correlation_id, code, rest[6:]

    def produce(self, message_set: bytes, producer_id: int, sequence: int, acks: int = 1):
        self.correlation += 1
        self.sock.sendall(
            req.encode_produce(self.correlation, self.topic, 0, acks, message_set, producer_id=producer_id, sequence=sequence, version=1)
        )
        if acks == 0:
            return None
        cid, code, body = self.reply()
        assert cid == self.correlation
        if code:
            raise rep.decode_error(code, body)
        return p.PRODUCE_REPLY_FIELDS.unpack(body)[0]

    def close(self):
        self.sock.close()


# -- idempotence across a SIGKILL ------------------------------------------------------


def test_a_retried_set_is_stored_once_across_a_sigkill_between_append_and_reply(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1, flush_ms=10**6, flush_messages=10**6)  # nothing flushed on purpose
    actor = raylog_client.partition_actor(topic, 0)
    producer_id = 4242
    raw = Raw(raylog_client, topic)
    try:
        first = raw.produce(encode_message_set([b"s0"]), producer_id, 0)
        # sequence 1 is appended, but its reply never comes: acks=0 here, and
        # the process dies right after the append
        raw.produce(encode_message_set([b"s1"]), producer_id, 1, acks=0)
        before = wait_for(
            lambda: (lambda s: s if s["log_end_offset"] > first + len(encode_message_set([b"s0"])) else None)(
                ray.get(actor.stats.remote(), timeout=10)
            ),
            30,
            "the second set appended",
        )
    finally:
        raw.close()
    os.kill(before["pid"], signal.SIGKILL)
    after = restarted(actor, before["pid"])
    assert after["log_end_offset"] == before["log_end_offset"]  # the page cache kept the appends

    # The producer retries everything unacknowledged, with the same sequences.
    retry = Raw(raylog_client, topic)
    try:
        assert retry.produce(encode_message_set([b"s0"]), producer_id, 0) == first
        second = retry.produce(encode_message_set([b"s1"]), producer_id, 1)
        assert second == first + len(encode_message_set([b"s0"]))
        retry.produce(encode_message_set([b"s2"]), producer_id, 2, acks=p.ACKS_ALL)
    finally:
        retry.close()
    assert read_all(raylog_client, topic) == [b"s0", b"s1", b"s2"]


# -- disk errors end the actor; Ray restarts it -------------------------------------------


def test_an_injected_fsync_failure_restarts_the_actor_and_accepted_data_is_intact(
    raylog_client, make_topic, monkeypatch
):
    import ray

    monkeypatch.setenv(faults.ENV, "1")  # travels to the actor (runtime_env)
    # Every append starts a flush on the log's background thread, and the
    # timer never flushes: the failure hits the path that used to wedge the
    # partition (the error stayed in the log, nothing flushed again).
    topic = make_topic(partitions=1, flush_messages=1, flush_ms=10**9)
    actor = raylog_client.partition_actor(topic, 0)
    with connection(raylog_client, topic) as conn:
        for i in range(10):
            conn.produce(topic, 0, encode_message_set([b"before-%d" % i]))
    old = ray.get(actor.stats.remote())
    wait_for(lambda: ray.get(actor.offsets.remote())[1] == old["log_end_offset"], 30, "flushed")

    faults.arm(old["log_dir"], "fsync")  # the next flush fails with EIO
    try:
        with connection(raylog_client, topic) as conn:
            conn.produce(topic, 0, encode_message_set([b"accepted-before-the-failure"]))
    except RaylogError:
        pass  # the process may already be gone when the reply is due
    new = restarted(actor, old["pid"])
    assert new["epoch"] > old["epoch"]
    assert not os.path.exists(os.path.join(old["log_dir"], faults.PREFIX + "fsync"))

    def serves():
        with connection(raylog_client, topic) as conn:
            return conn.produce(topic, 0, encode_message_set([b"after"]), acks=1) is not None

    wait_for(serves, 60, "the restarted actor serves")
    ray.get(actor.flush.remote())
    values = read_all(raylog_client, topic)
    assert values[:10] == [b"before-%d" % i for i in range(10)]
    assert values[-1] == b"after"
    assert values.count(b"accepted-before-the-failure") <= 1


# -- bounds: a zstd bomb -----------------------------------------------------------------


def zstd_bomb(inflated_bytes: int = 64 << 20) -> bytes:
    """One zstd wrapper of a few kB whose inner set is ``inflated_bytes`` of
    small valid messages."""
    message = encode_message(b"0123456789", timestamp_ms=1)
    inner = message * (inflated_bytes // len(message))
    return encode_message(compress(CODEC_ZSTD, inner), timestamp_ms=1, codec=CODEC_ZSTD)


def test_a_zstd_bomb_is_refused_at_produce_and_the_partition_keeps_serving(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1)
    bomb = zstd_bomb()
    assert len(bomb) < 16 << 10
    actor = raylog_client.partition_actor(topic, 0)
    pid = ray.get(actor.pid.remote())
    with connection(raylog_client, topic) as conn:
        conn.produce(topic, 0, encode_message_set([b"kept"]))
        with pytest.raises(InflatedSizeTooLargeError) as info:
            conn.produce(topic, 0, bomb)
        assert info.value.limit == 8 << 20 and not info.value.retriable
        conn.produce(topic, 0, encode_message_set([b"still served"], compression="zstd"))
    ray.get(actor.flush.remote())
    assert read_all(raylog_client, topic) == [b"kept", b"still served"]
    assert ray.get(actor.pid.remote()) == pid


# -- segment_ms: time retention reaches a quiet partition -----------------------------------


def test_a_quiet_partition_loses_its_old_messages_with_segment_ms(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1, segment_ms=1000, retention_ms=2000, retention_check_ms=200, flush_ms=20)
    actor = raylog_client.partition_actor(topic, 0)
    sent = []
    deadline = time.monotonic() + 60
    with connection(raylog_client, topic) as conn:
        while True:
            value = b"tick-%d" % len(sent)
            conn.produce(topic, 0, encode_message_set([value]))
            sent.append(value)
            start, _ = ray.get(actor.offsets.remote())
            if start > 0:
                break
            assert time.monotonic() < deadline, "old messages deleted within 60 s"
            time.sleep(1.0)  # one message a second
    ray.get(actor.flush.remote())
    values = wait_for(lambda: read_all(raylog_client, topic), 30, "read")
    assert values and values[0] != sent[0]  # the oldest are gone
    assert values == sent[sent.index(values[0]) :]  # the rest in order, none lost in between


# -- per-cluster directories -----------------------------------------------------------------


def test_two_clusters_with_the_same_topic_name_do_not_touch_each_others_files(zookeeper, ray_local, tmp_path):
    from raylog.client import Client

    shared = str(tmp_path / "shared-data")
    clients = [
        Client(zookeeper=zookeeper.connect_string, cluster=f"c{i}-{uuid.uuid4().hex[:8]}", data_dir=shared, data_host="127.0.0.1")
        for i in range(2)
    ]
    try:
        for i, client in enumerate(clients):
            client.create_topic("clicks", partitions=1)
            with connection(client, "clicks") as conn:
                conn.produce("clicks", 0, encode_message_set([b"cluster-%d" % i]))
        dirs = [client.registry.placement("clicks", 0)["log_dir"] for client in clients]
        assert dirs[0] != dirs[1]
        for client, directory in zip(clients, dirs):
            assert directory == os.path.join(shared, client.settings.cluster, "clicks-0")
        for i, client in enumerate(clients):
            assert read_all(client, "clicks") == [b"cluster-%d" % i]
        clients[0].delete_topic("clicks")
        assert not os.path.exists(dirs[0])
        assert os.path.isdir(dirs[1])
        assert read_all(clients[1], "clicks") == [b"cluster-1"]
    finally:
        for client in clients:
            try:
                for topic in client.list_topics():
                    client.delete_topic(topic)
            finally:
                client.close()


def test_a_second_actor_on_a_locked_directory_fails_with_a_clear_error(raylog_client, make_topic):
    import ray

    from raylog.actors.partition import partition_actor_class

    topic = make_topic(partitions=1)
    log_dir = raylog_client.registry.placement(topic, 0)["log_dir"]
    config = raylog_client.registry.topic_config(topic)
    intruder = partition_actor_class().options(max_restarts=0).remote(
        raylog_client.settings.zookeeper, raylog_client.settings.cluster, topic, 0, log_dir, config.to_json(), "127.0.0.1"
    )
    with pytest.raises(Exception, match="is locked by another owner"):
        ray.get(intruder.ping.remote(), timeout=60)
    ray.kill(intruder)
    assert read_all(raylog_client, topic) == []


def test_an_actor_restarting_while_zookeeper_is_down_serves_once_it_is_back(ray_local, private_zookeeper, tmp_path):
    """The actor's constructor needs ZooKeeper (the delete check, its
    endpoint). Restarted during an outage longer than one connection attempt
    (10 s), it waits for ZooKeeper instead of failing: Ray never restarts an
    actor whose constructor raised, and the partition would stay unserved."""
    from raylog.client import Client
    from raylog.testing import faults as kit

    client = Client(zookeeper=private_zookeeper.connect_string, cluster=f"zkdown-{uuid.uuid4().hex[:8]}",
                    data_dir=str(tmp_path / "data"), data_host="127.0.0.1")
    try:
        client.create_topic("t", partitions=1)
        values = [b"before-%d" % i for i in range(10)]
        producer = client.producer(acks="all")
        for value in values:
            producer.send("t", value)
        producer.close()
        actor = client.partition_actor("t", 0)
        pid = kit.actor_pid(actor)
        old_endpoint = client.metadata.endpoint("t", 0, refresh=True)
        private_zookeeper.kill_process()
        try:
            kit.kill_process(pid)  # Ray starts the actor again now, with ZooKeeper away
            time.sleep(15)  # longer than a connection attempt (10 s)
        finally:
            private_zookeeper.start()
        import ray

        # the restarted actor answers once its constructor is done
        wait_for(lambda: ray.get(actor.offsets.remote(), timeout=10), 120, "the restarted actor serving")
        # this client's own session expired in the outage: its new one sees the new endpoint
        wait_for(lambda: client.metadata.endpoint("t", 0, refresh=True) != old_endpoint, 120,
                 "the new endpoint through a new session")
        consumer = client.consumer("t", auto_offset_reset="earliest")
        try:
            got, deadline = [], time.monotonic() + 120
            while len(got) < len(values):
                assert time.monotonic() < deadline, f"read {len(got)} of {len(values)} after the outage"
                got += [m.value for m in consumer.poll(timeout_ms=500)]
        finally:
            consumer.close()
        assert got == values
        assert kit.actor_pid(actor) != pid
    finally:
        client.delete_topic("t")
        client.close()
