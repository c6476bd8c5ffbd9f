"""CreatePartitions through the Kafka front door (raylog.kafka.admin, issue
49) with kafka-python's KafkaAdminClient, confluent-kafka's AdminClient and
raw requests, on real ZooKeeper, Ray and sockets: a topic grows as
``client.add_partitions`` grows it, checked against raylog's own view
(``client.metadata.partitions``, ``client.describe_topic``), and a Kafka
producer writes to a new partition, and a Kafka consumer group takes the
new partitions at its next join; a count not larger than now, an unknown
topic, replica assignments and a topic named twice are refused per topic and
nothing changes; validate_only changes nothing; every served version answers."""

from __future__ import annotations

import time
import uuid

import pytest

from raylog.testing.clusters import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import AdminClient, NewPartitions  # noqa: E402

from tests.kafka.kafka_raw import RawKafka  # noqa: E402

WAIT_S = 120.0


def _topic(client, partitions: int = 1) -> str:
    name = f"kp-{uuid.uuid4().hex[:12]}"
    client.create_topic(name, partitions=partitions)
    return name


def _refused(future):
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        future.result(timeout=WAIT_S)
    return raised.value.args[0]


def _read_all(raylog_client, topic: str, want: int) -> list:
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = []
    try:
        assert wait_until(lambda: got.extend(consumer.poll(200)) or len(got) >= want, WAIT_S), got
    finally:
        consumer.close()
    return got


def _served(raylog_client, topic: str, count: int) -> bool:
    rows = raylog_client.describe_topic(topic)["partitions"]
    return len(rows) == count and all(row["served"] for row in rows)


# -------------------------------------------------------------- failures first


@pytest.mark.parametrize("total", [2, 1], ids=["equal", "smaller"])
def test_a_count_not_larger_than_now_is_invalid_partitions_and_keeps_the_data(raylog_client, kafka_config, total):
    name = _topic(raylog_client, partitions=2)
    producer = raylog_client.producer(acks=1)
    for p in (0, 1):
        producer.send(name, b"kept-%d" % p, partition=p)
    producer.close()
    admin = AdminClient(kafka_config)
    err = _refused(admin.create_partitions([NewPartitions(name, total)])[name])
    assert err.name() == "INVALID_PARTITIONS"
    assert "has 2 partitions" in err.str()
    assert raylog_client.metadata.partitions(name) == 2 and len(raylog_client.describe_topic(name)["partitions"]) == 2
    assert sorted(m.value for m in _read_all(raylog_client, name, 2)) == [b"kept-0", b"kept-1"]


def test_an_unknown_topic_and_validate_only_change_nothing(raylog_client, kafka_config):
    name = _topic(raylog_client)
    admin = AdminClient(kafka_config)
    missing = f"kp-{uuid.uuid4().hex[:12]}"
    err = _refused(admin.create_partitions([NewPartitions(missing, 3)])[missing])
    assert err.name() == "UNKNOWN_TOPIC_OR_PART"
    assert missing not in raylog_client.list_topics()
    assert admin.create_partitions([NewPartitions(name, 3)], validate_only=True)[name].result(WAIT_S) is None
    assert raylog_client.describe_topic(name)["config"].partitions == 1
    err = _refused(admin.create_partitions([NewPartitions(name, 1)], validate_only=True)[name])
    assert err.name() == "INVALID_PARTITIONS"


def test_replica_assignments_a_topic_named_twice_and_a_bound_are_refused(raylog_client, kafka_config):
    from kafka.protocol.admin import CreatePartitionsRequest, CreatePartitionsResponse

    from raylog.kafka.admin import MAX_TOPICS

    name = _topic(raylog_client)
    Topic = CreatePartitionsRequest.CreatePartitionsTopic
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        assigned = Topic(name=name, count=2, assignments=[
            Topic.CreatePartitionsAssignment(broker_ids=[0])])
        answer = raw.request(CreatePartitionsRequest[1](topics=[assigned], timeout_ms=30_000, validate_only=False),
                             CreatePartitionsResponse)
        assert [(r.name, r.error_code) for r in answer.results] == [(name, 39)]  # INVALID_REPLICA_ASSIGNMENT
        twice = [Topic(name=name, count=2, assignments=None), Topic(name=name, count=3, assignments=None)]
        answer = raw.request(CreatePartitionsRequest[1](topics=twice, timeout_ms=30_000, validate_only=False),
                             CreatePartitionsResponse)
        assert [r.error_code for r in answer.results] == [42, 42]  # INVALID_REQUEST
        assert "named 2 times" in answer.results[0].error_message
    assert raylog_client.describe_topic(name)["config"].partitions == 1
    with RawKafka(kafka_config) as raw:  # more topics than served in one request: the connection closes
        raw.authenticate()
        many = [Topic(name=f"{name}-{i}", count=2, assignments=None) for i in range(MAX_TOPICS + 1)]
        request = CreatePartitionsRequest[1](topics=many, timeout_ms=0, validate_only=True)
        request.with_header(correlation_id=7, client_id="raw")
        raw.sock.sendall(bytes(request.encode(header=True, framed=True)))
        assert raw.read_frame() is None


# -------------------------------------------------------------- what works


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_every_served_version_grows_a_topic(raylog_client, kafka_config, version):
    from kafka.protocol.admin import CreatePartitionsRequest, CreatePartitionsResponse

    name = _topic(raylog_client)
    Topic = CreatePartitionsRequest.CreatePartitionsTopic
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        answer = raw.request(CreatePartitionsRequest[version](
            topics=[Topic(name=name, count=2, assignments=None)], timeout_ms=60_000, validate_only=False),
            CreatePartitionsResponse)
    assert [(r.name, r.error_code, r.error_message) for r in answer.results] == [(name, 0, None)]
    assert raylog_client.metadata.partitions(name) == 2 and _served(raylog_client, name, 2)


def test_kafka_python_admin_creates_partitions_and_a_kafka_producer_writes_to_them(raylog_client, kafka_config):
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient

    name = _topic(raylog_client, partitions=2)
    sasl = dict(bootstrap_servers=kafka_config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=kafka_config["sasl.username"],
                sasl_plain_password=kafka_config["sasl.password"])
    admin = KafkaAdminClient(**sasl)
    try:
        admin.create_partitions({name: 4})
    finally:
        admin.close()
    # raylog's own view: the count, each new partition placed and served
    assert raylog_client.metadata.partitions(name) == 4
    assert _served(raylog_client, name, 4)
    producer = KafkaProducer(**sasl, acks=1)
    try:
        sent = producer.send(name, b"to-3", partition=3).get(timeout=WAIT_S)
        assert sent.partition == 3
    finally:
        producer.close()
    assert [(m.partition, m.value) for m in _read_all(raylog_client, name, 1)] == [(3, b"to-3")]


def test_confluent_admin_creates_partitions_and_a_kafka_producer_writes_to_them(raylog_client, kafka_config):
    name = _topic(raylog_client)
    admin = AdminClient(kafka_config)
    # operation_timeout 0 (librdkafka's default): answered without waiting for the actors, as Kafka's broker
    assert admin.create_partitions([NewPartitions(name, 3)])[name].result(WAIT_S) is None
    assert raylog_client.metadata.partitions(name) == 3  # recorded before the answer
    assert wait_until(lambda: _served(raylog_client, name, 3), WAIT_S)
    described = admin.list_topics(name, timeout=30).topics[name]
    assert sorted(described.partitions) == [0, 1, 2]
    delivered = []
    producer = confluent_kafka.Producer({**kafka_config, "linger.ms": 5})
    producer.produce(name, b"to-2", partition=2, on_delivery=lambda err, msg: delivered.append((err, msg.partition())))
    assert producer.flush(WAIT_S) == 0
    assert delivered == [(None, 2)]
    assert [(m.partition, m.value) for m in _read_all(raylog_client, name, 1)] == [(2, b"to-2")]


def test_a_kafka_consumer_group_takes_the_added_partitions(raylog_client, kafka_config):
    name = _topic(raylog_client, partitions=2)
    group = f"kpg-{uuid.uuid4().hex[:8]}"
    consumers = [confluent_kafka.Consumer({
        **kafka_config, "group.id": group, "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 300, "partition.assignment.strategy": "range", "fetch.wait.max.ms": 100,
        "topic.metadata.refresh.interval.ms": 500}) for _ in range(2)]
    got = []

    def poll_until(done) -> bool:
        deadline = time.monotonic() + WAIT_S
        while not done() and time.monotonic() < deadline:
            for consumer in consumers:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append((msg.partition(), msg.value()))
        return done()

    def assigned() -> list[int]:
        return sorted(tp.partition for c in consumers for tp in c.assignment())

    try:
        for consumer in consumers:
            consumer.subscribe([name])
        assert poll_until(lambda: assigned() == [0, 1]), assigned()
        admin = AdminClient(kafka_config)
        assert admin.create_partitions([NewPartitions(name, 4)], operation_timeout=60)[name].result(WAIT_S) is None
        # the members' metadata refresh sees 4 partitions: they join again, range over 4
        assert poll_until(lambda: assigned() == [0, 1, 2, 3] and all(len(c.assignment()) == 2 for c in consumers)), \
            assigned()
        producer = raylog_client.producer(acks=1)
        for p in range(4):
            producer.send(name, b"p%d" % p, partition=p)
        producer.close()
        assert poll_until(lambda: len(got) >= 4), got
        assert sorted(got) == [(p, b"p%d" % p) for p in range(4)]
    finally:
        for consumer in consumers:
            consumer.close()
