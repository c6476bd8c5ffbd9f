"""The listener actor: pinned per disk node, registered in ZooKeeper, started
again by Ray when its process dies, stopped with the client that started it."""

from __future__ import annotations

import time
import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

WAIT_S = 60.0


def test_a_killed_listener_comes_back_registered_and_serves(raylog_client, listeners):
    import ray

    from raylog.config import NAMESPACE
    from raylog.kafka import brokers
    from raylog.kafka.service import listener_name

    found = brokers.listeners(raylog_client._zk, raylog_client.registry.paths)
    assert {e["node"]: e for e in listeners} == found  # the path: /raylog/<cluster>/kafka/listeners/<node>
    node = listeners[0]["node"]
    assert raylog_client.start_kafka_listeners() == listeners  # started once per node
    # the topic serves before the listener is killed: what follows waits on the listener alone
    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic)
    first = raylog_client.producer(acks=1)
    first.send(topic, b"before", partition=0).result(timeout_s=WAIT_S)
    first.close()
    config_before = raylog_client.kafka_config()
    actor = ray.get_actor(listener_name(raylog_client.settings.cluster, node), namespace=NAMESPACE)
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + WAIT_S
    entry = None
    while time.monotonic() < deadline:
        try:
            entry = ray.get(actor.entry.remote(), timeout=WAIT_S)
            break
        except ray.exceptions.RayActorError:
            time.sleep(0.2)
    assert entry is not None and entry["node"] == node
    assert entry["port"] == listeners[0]["port"]  # the port bound before: bootstrap lists stay right
    assert brokers.listeners(raylog_client._zk, raylog_client.registry.paths)[node] == entry
    end = raylog_client.offsets(topic, 0)[1]
    # the settings read before the restart still reach the listener
    producer = confluent_kafka.Producer({**config_before, "acks": "all"})
    producer.produce(topic, b"after a restart", partition=0)
    assert producer.flush(WAIT_S) == 0
    assert raylog_client.offsets(topic, 0)[1] > end


def test_kafka_config_names_the_listeners_and_the_credentials(raylog_client, listeners):
    from raylog.kafka import brokers

    config = raylog_client.kafka_config()
    running = brokers.listeners(raylog_client._zk, raylog_client.registry.paths).values()
    assert sorted(config["bootstrap.servers"].split(",")) == sorted(f"{e['host']}:{e['port']}" for e in running)
    assert config["security.protocol"] == "SASL_PLAINTEXT" and config["sasl.mechanisms"] == "SCRAM-SHA-256"
    assert config["sasl.username"] == raylog_client.settings.cluster
    assert config["sasl.password"].encode() == raylog_client.settings.token


def test_a_registration_that_vanished_is_made_again(raylog_client, listeners):
    """What an expired ZooKeeper session does to the listener's ephemeral
    node: deleted, it is back (the same entry) within a few checks."""
    from raylog.kafka import brokers
    from raylog.kafka.service import REGISTRATION_CHECK_S

    paths = raylog_client.registry.paths
    node = listeners[0]["node"]
    before = brokers.listeners(raylog_client._zk, paths)[node]
    raylog_client._zk.delete(paths.kafka_listener(node))
    deadline = time.monotonic() + 10 * REGISTRATION_CHECK_S + WAIT_S
    while node not in brokers.listeners(raylog_client._zk, paths):
        assert time.monotonic() < deadline, "the listener did not register again"
        time.sleep(0.2)
    assert brokers.listeners(raylog_client._zk, paths)[node] == before
