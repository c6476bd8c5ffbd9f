"""The listener's connection model: idle connections wait in one selector,
not on a thread each. A thousand idle authenticated connections leave the
listener's thread count far below a thousand while a confluent-kafka
producer and consumer are served, and each idle one is still answered when
it speaks again; a stranger that connects and sends nothing is closed at
its authentication deadline while parked; the worker pool grown by a
burst shrinks back while one client keeps sending (work goes to the worker
idle last, so the others idle long enough to end)."""

from __future__ import annotations

import time
import uuid

import pytest

from kafka_raw import RawKafka, bootstrap

confluent_kafka = pytest.importorskip("confluent_kafka")

IDLE = 1000
#: how many threads the listener's process may gain while serving the idle
#: connections (a thread each would be IDLE)
THREAD_GROWTH_BOUND = 100
WAIT_S = 60.0


@pytest.fixture(scope="module")
def listener_actor(raylog_client, listeners):
    import ray

    from raylog.config import NAMESPACE
    from raylog.kafka.service import listener_name

    assert len(listeners) == 1
    return ray.get_actor(listener_name(raylog_client.settings.cluster, listeners[0]["node"]), namespace=NAMESPACE)


def _stats(actor) -> dict:
    import ray

    return ray.get(actor.stats.remote(), timeout=30)


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads in /proc/<pid>/status")


def _round_trip(config: dict, topic: str, n: int = 200) -> list[bytes]:
    from confluent_kafka import Consumer, Producer

    producer = Producer({**config, "linger.ms": 5, "message.timeout.ms": 60000})
    for i in range(n):
        producer.produce(topic, value=b"v%d" % i)
        producer.poll(0)
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        got, deadline = [], time.monotonic() + WAIT_S
        while len(got) < n and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append(message.value())
    finally:
        consumer.close()
    return got


def test_a_thousand_idle_authenticated_connections_hold_no_thread_each(raylog_client, kafka_config, listener_actor):
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic)
    pid = _stats(listener_actor)["pid"]
    before = _threads(pid)
    idle = []
    try:
        for _ in range(IDLE):
            raw = RawKafka(kafka_config, timeout_s=WAIT_S)
            idle.append(raw)
            raw.authenticate()
        time.sleep(1.0)  # (workers that served the handshakes may linger; the count is of what stays)
        stats = _stats(listener_actor)
        assert stats["connections"] >= IDLE and stats["strangers"] == 0
        assert _threads(pid) - before < THREAD_GROWTH_BOUND, (before, _threads(pid), stats.get("workers"))
        got = _round_trip(kafka_config, topic)
        assert sorted(got) == sorted(b"v%d" % i for i in range(200))
        for raw in idle[::100]:  # parked connections are answered when they speak again
            assert raw.request(MetadataRequest[1](topics=[]), MetadataResponse).brokers
        assert _threads(pid) - before < THREAD_GROWTH_BOUND
    finally:
        for raw in idle:
            raw.close()


def test_a_parked_stranger_that_sends_nothing_is_closed_at_its_auth_deadline(kafka_config, listener_actor):
    import socket

    from raylog.kafka.listener import DEFAULT_AUTH_TIMEOUT_S, SWEEP_S

    sock = socket.create_connection(bootstrap(kafka_config), timeout=10)
    start = time.monotonic()
    try:
        sock.settimeout(DEFAULT_AUTH_TIMEOUT_S + 10)
        assert sock.recv(1) == b"", "a stranger that sent nothing was answered"
        took = time.monotonic() - start
    finally:
        sock.close()
    assert DEFAULT_AUTH_TIMEOUT_S - 0.5 <= took <= DEFAULT_AUTH_TIMEOUT_S + SWEEP_S + 5.0, took  # (a loaded machine)


def test_the_worker_pool_shrinks_back_while_one_client_keeps_it_busy(kafka_config, listener_actor):
    import threading

    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    from raylog.kafka.listener import MIN_WORKERS, WORKER_IDLE_S

    def busy(rounds: int = 30) -> None:
        with RawKafka(kafka_config, timeout_s=WAIT_S) as raw:
            raw.authenticate()
            for _ in range(rounds):
                raw.request(MetadataRequest[1](topics=[]), MetadataResponse)

    threads = [threading.Thread(target=busy) for _ in range(16)]  # a burst: many workers at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    grown = _stats(listener_actor)["workers"]
    assert grown >= MIN_WORKERS + 4, grown  # (else the burst did not grow the pool, and this shows nothing)
    with RawKafka(kafka_config, timeout_s=WAIT_S) as raw:  # one client, a request every 20 ms
        raw.authenticate()
        until = time.monotonic() + WORKER_IDLE_S + 3.0
        while time.monotonic() < until:
            assert raw.request(MetadataRequest[1](topics=[]), MetadataResponse).brokers
            time.sleep(0.02)
        shrunk = _stats(listener_actor)["workers"]
    assert shrunk <= MIN_WORKERS + 2, (grown, shrunk)
