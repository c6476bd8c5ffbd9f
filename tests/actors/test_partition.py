"""The partition actor under faults: kill -9 under load, hostile frames on
its data port. Real Ray, real ZooKeeper, real sockets."""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import threading
import time

from raylog.errors import RaylogError
from raylog.storage.message import encode_message_set
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.handshake import authenticate_socket
from tests.stored import stored_records


def _wait_for(predicate, timeout_s: float, what: str):
    from ray.exceptions import RayError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (RaylogError, RayError):  # the actor is restarting
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.1)


def _read_all(client, topic: str) -> list[bytes]:
    return [v for _, _, _, v in stored_records(client, topic)]


def test_kill_9_under_load_loses_no_acknowledged_flushed_message(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1, flush_ms=20)
    actor = raylog_client.partition_actor(topic, 0)
    old = ray.get(actor.stats.remote())

    acked: list[bytes] = []
    stop = threading.Event()

    def load():
        i = 0
        conn = None
        while not stop.is_set():
            try:
                if conn is None:
                    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
                    conn = BrokerConnection(host, port, token=raylog_client.settings.token, timeout_s=5)
                batch = [b"msg-%08d" % (i + j) for j in range(20)]
                conn.produce(topic, 0, encode_message_set(batch), acks=1)
                acked.extend(batch)
                i += 20
            except RaylogError:
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
        if conn is not None:
            conn.close()

    thread = threading.Thread(target=load)
    thread.start()
    try:
        _wait_for(lambda: len(acked) > 2000, 60, "load running")
        # Everything acknowledged up to here is flushed once the high
        # watermark passes it; then kill the process without warning.
        flushed_count = len(acked)
        hw = ray.get(actor.flush.remote())
        os.kill(old["pid"], signal.SIGKILL)
        time.sleep(1.0)
    except BaseException:
        stop.set()
        thread.join(timeout=30)
        raise

    try:
        new = _wait_for(
            lambda: (lambda s: s if s["pid"] != old["pid"] else None)(ray.get(actor.stats.remote(), timeout=10)),
            120,
            "the partition actor restarted",
        )
        assert new["epoch"] > old["epoch"]
        assert new["high_watermark"] >= hw
        endpoint = raylog_client.registry.endpoint(topic, 0)
        assert endpoint["epoch"] == new["epoch"] and endpoint["port"] == new["port"]
        _wait_for(lambda: len(acked) > flushed_count + 500, 60, "load continues after the restart")
    finally:
        stop.set()
        thread.join(timeout=30)

    ray.get(actor.flush.remote())
    stored = _read_all(raylog_client, topic)
    stored_set = set(stored)
    missing = [v for v in acked[:flushed_count] if v not in stored_set]
    assert not missing, f"{len(missing)} acknowledged, flushed messages lost (first {missing[:3]})"
    # and the log reads back clean: every message whole and CRC-valid
    assert len(stored) >= flushed_count


def _hostile_frames(rng: random.Random, n: int):
    """Random garbage, truncated frames and frames claiming huge sizes."""
    for i in range(n):
        kind = i % 4
        if kind == 0:
            yield rng.randbytes(rng.randrange(1, 64))
        elif kind == 1:
            yield struct.pack(">I", rng.choice([2**31, 2**32 - 1, 50 * 2**20])) + rng.randbytes(8)
        elif kind == 2:
            body = rng.randbytes(rng.randrange(4, 40))
            yield struct.pack(">I", len(body) + rng.randrange(1, 100)) + body  # truncated
        else:
            body = bytes([rng.randrange(0, 8), 0]) + rng.randbytes(rng.randrange(0, 60))
            yield struct.pack(">I", len(body)) + body


def test_hostile_frames_are_refused_and_memory_stays_bounded(raylog_client, make_topic):
    import psutil
    import ray

    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1)
    for i in range(100):
        producer.send(topic, b"before-%d" % i)
    producer.flush()

    actor = raylog_client.partition_actor(topic, 0)
    pid = ray.get(actor.pid.remote())
    process = psutil.Process(pid)
    rss_before = process.memory_info().rss
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)

    rng = random.Random(20111)
    frames = list(_hostile_frames(rng, 10_000))
    deadline = time.monotonic() + 240
    sent = 0
    sock = None
    for frame in frames:
        assert time.monotonic() < deadline, "fuzzing took too long"
        if sock is None:
            sock = socket.create_connection((host, port), timeout=5)
            # authenticated, so that the frames reach the parser behind AUTH
            authenticate_socket(sock, raylog_client.settings.token)
        try:
            sock.sendall(frame)
            sent += 1
        except OSError:
            sock.close()
            sock = None
            continue
        if sent % 25 == 0:
            sock.close()  # start over on a fresh connection now and then
            sock = None
    if sock is not None:
        sock.close()

    rss_after = process.memory_info().rss
    assert process.pid == ray.get(actor.pid.remote()), "the actor died under hostile frames"
    assert rss_after - rss_before < 64 * 2**20, f"memory grew by {(rss_after - rss_before) / 2**20:.1f} MiB"

    # normal clients keep working, and the data accepted before is intact
    producer.send(topic, b"after")
    producer.flush()
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 101 and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout_ms=500))
    consumer.close()
    values = [m.value for m in got]
    assert values[:100] == [b"before-%d" % i for i in range(100)]
    assert b"after" in values
    stats = ray.get(actor.stats.remote())
    assert stats["server"]["errors"], "the server counted no refused frames"


def test_torn_tail_is_truncated_and_reported_after_a_crash(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1)
    for i in range(50):
        producer.send(topic, b"whole-%d" % i)
    producer.flush()
    actor = raylog_client.partition_actor(topic, 0)
    old = ray.get(actor.stats.remote())
    hw = ray.get(actor.flush.remote())

    # a torn write: half a message past the flushed end, then the process dies
    segments = sorted(f for f in os.listdir(old["log_dir"]) if f.endswith(".log"))
    with open(os.path.join(old["log_dir"], segments[-1]), "ab") as f:
        f.write(encode_message_set([b"torn" * 50])[:60])
    os.kill(old["pid"], signal.SIGKILL)

    new = _wait_for(
        lambda: (lambda s: s if s["pid"] != old["pid"] else None)(ray.get(actor.stats.remote(), timeout=10)),
        120,
        "the partition actor restarted",
    )
    assert new["high_watermark"] == hw
    assert new["log_end_offset"] == hw
    reports = new["recovery_reports"]
    assert len(reports) == 1 and reports[0]["truncated_bytes"] == 60
    assert reports[0]["start_offset"] == hw
    assert _read_all(raylog_client, topic) == [b"whole-%d" % i for i in range(50)]
