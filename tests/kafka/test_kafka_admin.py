"""CreateTopics, DeleteTopics and DescribeConfigs through the Kafka front
door with confluent-kafka's AdminClient, on real ZooKeeper, Ray and
sockets: topics made as client.create_topic makes them, configs under
Kafka's names, unknown configs refused by name with nothing created,
validate_only honoured; a topic deleted and made again is served with its
new partition count and configs."""

from __future__ import annotations

import time
import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # noqa: E402

WAIT_S = 120.0


def _name() -> str:
    return f"ka-{uuid.uuid4().hex[:12]}"


def _error(future):
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        future.result(timeout=WAIT_S)
    return raised.value.args[0]


def test_create_topics_serves_the_topic_with_its_kafka_configs(raylog_client, kafka_config):
    admin = AdminClient(kafka_config)
    name = _name()
    futures = admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=-1,
                                            config={"retention.ms": "3600000", "max.message.bytes": "65536",
                                                    "cleanup.policy": "delete"})],
                                  operation_timeout=WAIT_S)
    assert futures[name].result(timeout=WAIT_S) is None
    described = raylog_client.describe_topic(name)
    config = described["config"]
    assert (config.partitions, config.retention_ms, config.max_message_bytes, config.replication_factor) == (
        3, 3_600_000, 65_536, 1)
    assert all(p["endpoint"] is not None for p in described["partitions"])
    producer = confluent_kafka.Producer(kafka_config)
    producer.produce(name, b"through the new topic", partition=2)
    assert producer.flush(60) == 0
    assert raylog_client.offsets(name, 2)[1] > 0

    again = _error(admin.create_topics([NewTopic(name, num_partitions=1)], operation_timeout=WAIT_S)[name])
    assert again.name() == "TOPIC_ALREADY_EXISTS"


@pytest.mark.parametrize("config, refused", [
    ({"compression.type": "lz4"}, "compression.type"),
    ({"cleanup.policy": "shred"}, "cleanup.policy"),
    ({"retention.ms": "soon"}, "retention.ms"),
    ({"segment.bytes": "0"}, "segment.bytes"),
    ({"min.cleanable.dirty.ratio": "2"}, "min.cleanable.dirty.ratio"),
    ({"min.cleanable.dirty.ratio": "half"}, "min.cleanable.dirty.ratio"),
    ({"delete.retention.ms": "-1"}, "delete.retention.ms"),
    ({"cleanup.policy": "compact", "min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "1000"},
     "max.compaction.lag.ms"),
])
def test_an_unknown_or_bad_config_is_refused_by_name_and_nothing_is_created(raylog_client, kafka_config, config,
                                                                           refused):
    admin = AdminClient(kafka_config)
    name = _name()
    err = _error(admin.create_topics([NewTopic(name, num_partitions=1, config=config)],
                                     operation_timeout=WAIT_S)[name])
    assert err.name() == "INVALID_CONFIG" and refused in err.str(), err
    assert name not in raylog_client.list_topics()


def test_a_compacted_topic_is_created_and_described_with_kafka_names(raylog_client, kafka_config):
    # what Quix Streams and Kafka's AdminClient ask for at start-up (issue 46)
    admin = AdminClient(kafka_config)
    name = _name()
    configs = {"cleanup.policy": "delete,compact", "delete.retention.ms": "60000", "min.compaction.lag.ms": "1000",
               "max.compaction.lag.ms": "3600000", "min.cleanable.dirty.ratio": "0.25"}
    futures = admin.create_topics([NewTopic(name, num_partitions=1, config=configs)], operation_timeout=WAIT_S)
    assert futures[name].result(timeout=WAIT_S) is None
    config = raylog_client.describe_topic(name)["config"]
    assert (config.cleanup_policy, config.delete_retention_ms, config.min_compaction_lag_ms,
            config.max_compaction_lag_ms, config.min_cleanable_dirty_ratio) == (
        "compact,delete", 60_000, 1_000, 3_600_000, 0.25)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    entries = admin.describe_configs([resource])[resource].result(timeout=WAIT_S)
    assert {key: entries[key].value for key in configs} == {**configs, "cleanup.policy": "compact,delete"}
    assert all(entries[key].source == confluent_kafka.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
               for key in configs)
    compact = _name()
    futures = admin.create_topics([NewTopic(compact, num_partitions=1, config={"cleanup.policy": "compact"})],
                                  operation_timeout=WAIT_S)
    assert futures[compact].result(timeout=WAIT_S) is None
    resource = ConfigResource(ConfigResource.Type.TOPIC, compact)
    entries = admin.describe_configs([resource])[resource].result(timeout=WAIT_S)
    assert entries["cleanup.policy"].value == "compact"
    assert entries["delete.retention.ms"].source == confluent_kafka.admin.ConfigSource.DEFAULT_CONFIG.value


def test_validate_only_creates_nothing_and_still_checks(raylog_client, kafka_config):
    admin = AdminClient(kafka_config)
    name = _name()
    futures = admin.create_topics([NewTopic(name, num_partitions=2)], validate_only=True, operation_timeout=WAIT_S)
    assert futures[name].result(timeout=WAIT_S) is None
    assert name not in raylog_client.list_topics()
    err = _error(admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=5)], validate_only=True,
                                     operation_timeout=WAIT_S)[name])
    assert err.name() == "INVALID_REPLICATION_FACTOR"
    err = _error(admin.create_topics([NewTopic("bad/name", num_partitions=1)], validate_only=True,
                                     operation_timeout=WAIT_S)["bad/name"])
    assert err.name() == "TOPIC_EXCEPTION"


def test_describe_configs_of_a_topic_and_a_broker(raylog_client, kafka_config, listeners):
    name = _name()
    raylog_client.create_topic(name, partitions=1, retention_ms=120_000, segment_bytes=1 << 20)
    admin = AdminClient(kafka_config)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    entries = admin.describe_configs([resource])[resource].result(timeout=WAIT_S)
    assert entries["retention.ms"].value == "120000"
    assert entries["segment.bytes"].value == str(1 << 20)
    assert entries["cleanup.policy"].value == "delete"
    assert entries["retention.ms"].source == confluent_kafka.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["max.message.bytes"].source == confluent_kafka.admin.ConfigSource.DEFAULT_CONFIG.value
    broker = ConfigResource(ConfigResource.Type.BROKER, str(listeners[0]["broker_id"]))
    broker_entries = admin.describe_configs([broker])[broker].result(timeout=WAIT_S)
    assert broker_entries["num.partitions"].value == "1"
    assert broker_entries["auto.create.topics.enable"].value == "false"
    missing = ConfigResource(ConfigResource.Type.TOPIC, _name())
    assert _error(admin.describe_configs([missing])[missing]).name() == "UNKNOWN_TOPIC_OR_PART"


def test_delete_topics_removes_the_topic_and_an_unknown_one_is_an_error(raylog_client, kafka_config):
    name = _name()
    raylog_client.create_topic(name, partitions=2)
    admin = AdminClient(kafka_config)
    assert admin.delete_topics([name], operation_timeout=WAIT_S)[name].result(timeout=WAIT_S) is None
    deadline = time.monotonic() + 30
    while name in raylog_client.list_topics() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert name not in raylog_client.list_topics()
    err = _error(admin.delete_topics([name], operation_timeout=WAIT_S)[name])
    assert err.name() == "UNKNOWN_TOPIC_OR_PART"


def test_a_topic_deleted_and_made_again_is_served_as_made_again(raylog_client, kafka_config):
    # the same listeners serve the new topic: its partition count and configs, not the old one's
    name = _name()
    raylog_client.create_topic(name, partitions=3, retention_ms=120_000)
    admin = AdminClient(kafka_config)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    assert admin.describe_configs([resource])[resource].result(timeout=WAIT_S)["retention.ms"].value == "120000"
    producer = confluent_kafka.Producer({**kafka_config, "acks": "all"})
    for i in range(30):
        producer.produce(name, b"old-%d" % i, key=b"%d" % i)
    assert producer.flush(WAIT_S) == 0
    assert admin.delete_topics([name], operation_timeout=WAIT_S)[name].result(timeout=WAIT_S) is None
    deadline = time.monotonic() + 30
    while name in raylog_client.list_topics() and time.monotonic() < deadline:
        time.sleep(0.2)
    raylog_client.create_topic(name, partitions=1, retention_ms=240_000)

    assert admin.describe_configs([resource])[resource].result(timeout=WAIT_S)["retention.ms"].value == "240000"
    metadata = admin.list_topics(name, timeout=WAIT_S).topics[name]
    assert sorted(metadata.partitions) == [0]
    delivered = []
    producer = confluent_kafka.Producer({**kafka_config, "acks": "all"})
    for i in range(10):
        producer.produce(name, b"new-%d" % i, key=b"%d" % i,
                         on_delivery=lambda err, msg: delivered.append((err, msg.partition())))
    assert producer.flush(WAIT_S) == 0
    assert delivered == [(None, 0)] * 10
    consumer = confluent_kafka.Consumer({**kafka_config, "group.id": _name(), "auto.offset.reset": "earliest"})
    consumer.subscribe([name])
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 10 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    assert got == [b"new-%d" % i for i in range(10)]  # nothing of the old topic
