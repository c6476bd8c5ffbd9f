"""Kafka clients across real network boundaries, on the hosts kit
(:mod:`raylog.testing.hosts`: disk hosts ``h2``-``h4``, each with an address,
a Ray node and a disk of its own; this process, where the Kafka clients run,
is the client machine):

* ``start_kafka_listeners`` starts one listener per disk host, each on its
  own host's address (never a loopback address, which a client elsewhere
  could not reach), and ``kafka_config`` names them all;
* an idempotent confluent-kafka producer (acks=all) writes to a replicated
  topic whose leaders are on other hosts, and a consumer group of two reads
  every message once;
* the host of partition 0's leader cut off (its link down, its processes
  alive) while the producer is idle: what it sends then is delivered by
  librdkafka's own retries alone (no resend loop in the test), once a new
  leader on another host serves and the other listeners' Metadata names it;
  after the heal, each partition holds every message once, in order.

Every wait is bounded by a generous deadline of the test's own (the machine
is shared); no time is asserted.
"""

from __future__ import annotations

import time
import uuid

import pytest

from raylog.testing import faults
from raylog.testing.host_checks import heal_host
from raylog.testing.on_hosts import partition_state, wait

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(1800)]

PARTITIONS = 2


def _poll_until(consumers, done, got: dict, what: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    errors: list = []
    while time.monotonic() < deadline:
        for consumer in consumers:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.setdefault(message.partition(), []).append(message.value())
            elif message is not None and len(errors) < 50:
                errors.append(str(message.error()))
        if done():
            return
    # what the members hold and where they stand, and the errors they met: the evidence of a stall
    state = []
    for consumer in consumers:
        try:
            held = consumer.assignment()
            state.append([(tp.partition, tp.offset) for tp in consumer.position(held)])
        except Exception as err:  # noqa: BLE001 - the report of a failure
            state.append(repr(err))
    raise AssertionError(f"not within {timeout_s} s: {what}; read per partition "
                         f"{ {p: len(v) for p, v in got.items()} }; members' (partition, position): {state}; "
                         f"errors: {errors}")


def _produce(producer, topic: str, values: list[bytes]) -> dict:
    """Send ``values`` (key ``k<i % 5>``), wait for every delivery report;
    ``{partition: [values]}`` in the order delivered, failures raised."""
    delivered: dict = {}
    failed: list = []

    def report(err, message):
        if err is not None:
            failed.append(err)
        else:
            delivered.setdefault(message.partition(), []).append(message.value())

    for i, value in enumerate(values):
        producer.produce(topic, value, key=b"k%d" % (i % 5), on_delivery=report)
        producer.poll(0)
    assert producer.flush(300) == 0, "messages still queued after 300 s"
    assert not failed, failed[:3]
    return delivered


def _read_partitions(config: dict, topic: str, want: dict) -> dict:
    """Every message of each partition from its start (assigned, no group)."""
    consumer = confluent_kafka.Consumer({**config, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                                         "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                         for p in range(PARTITIONS)])
        got: dict = {}
        _poll_until([consumer], lambda: all(len(got.get(p, [])) >= len(v) for p, v in want.items()), got,
                    "every message read back")
        time.sleep(1.0)  # a surplus would come now
        _poll_until([consumer], lambda: True, got, "a last poll")
        return got
    finally:
        consumer.close()


def test_kafka_clients_reach_listeners_on_their_hosts_and_ride_through_a_cut_leader(hosts):
    client = hosts.client(cluster=f"kafka-{uuid.uuid4().hex[:8]}")
    topic = f"kh-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, partitions=PARTITIONS, replication_factor=3, min_insync_replicas=2, flush_ms=5)
    entries = client.start_kafka_listeners()
    disk = {h.address: h for h in hosts.disk_hosts}
    assert sorted(e["host"] for e in entries) == sorted(disk), entries
    config = client.kafka_config()
    assert sorted(s.rsplit(":", 1)[0] for s in config["bootstrap.servers"].split(",")) == sorted(disk)

    producer = confluent_kafka.Producer({**config, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    first = [b"a%03d" % i for i in range(200)]
    delivered = _produce(producer, topic, first)
    assert sorted(delivered) == list(range(PARTITIONS))

    group = f"kg-{uuid.uuid4().hex[:6]}"
    members = [confluent_kafka.Consumer({**config, "group.id": group, "auto.offset.reset": "earliest"})
               for _ in range(2)]
    try:
        for member in members:
            member.subscribe([topic])
        got: dict = {}
        _poll_until(members, lambda: sum(map(len, got.values())) >= len(first), got, "the group read everything")
        time.sleep(1.0)
        _poll_until(members, lambda: True, got, "a last poll")
        assert sorted(v for vs in got.values() for v in vs) == sorted(first)
    finally:
        for member in members:
            member.close()

    # the leader's host of partition 0 cut off while the producer is idle
    leader = partition_state(client, topic, 0).leader
    cut = next(h for h in hosts.disk_hosts if h.name == leader)
    faults.cut_host(cut)
    try:
        second = [b"b%03d" % i for i in range(100)]
        more = _produce(producer, topic, second)  # librdkafka's retries alone
        assert sum(map(len, more.values())) == len(second)
        wait(lambda: partition_state(client, topic, 0).leader != leader, "another replica leads partition 0")
    finally:
        heal_host(hosts, cut)
    want = {p: delivered.get(p, []) + more.get(p, []) for p in range(PARTITIONS)}
    assert _read_partitions(config, topic, want) == want
    producer.flush(30)
