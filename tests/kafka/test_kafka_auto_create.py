"""Topics created on a Kafka client's first request for them
(raylog.kafka.auto_create; Kafka's ``auto.create.topics.enable``), on real
ZooKeeper, Ray and sockets: off by default (a producer to a missing topic
creates nothing); turned on, a confluent-kafka producer's first send makes
the topic, with one partition and raylog's defaults, and its records are
stored; a Metadata request that does not allow creation, and a name that
is not a topic name, create nothing."""

from __future__ import annotations

import uuid

import pytest

from raylog.errors import UnknownTopicError
from raylog.testing.clusters import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")

from kafka.protocol.metadata import MetadataRequest, MetadataResponse  # noqa: E402

from tests.kafka.kafka_raw import RawKafka  # noqa: E402

WAIT_S = 120.0
UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, INVALID_TOPIC_EXCEPTION = 3, 5, 17


@pytest.fixture
def auto_create(raylog_client, listeners):
    raylog_client.start_kafka_listeners(auto_create_topics=True)
    try:
        yield
    finally:
        raylog_client.start_kafka_listeners(auto_create_topics=False)


def _metadata(config, name: str, version: int, allow: bool = True) -> int:
    Topic = MetadataRequest.MetadataRequestTopic
    fields = {"allow_auto_topic_creation": allow} if version >= 4 else {}
    with RawKafka(config) as raw:
        raw.authenticate()
        answer = raw.request(MetadataRequest[version](topics=[Topic(name=name)], **fields), MetadataResponse)
    (topic,) = answer.topics
    return topic.error_code


def _produce(config, topic: str, values, timeout_ms: int = 60_000) -> list:
    outcomes = []
    producer = confluent_kafka.Producer({**config, "message.timeout.ms": timeout_ms})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(timeout_ms / 1000.0 + 10)
    return outcomes


def test_off_by_default_a_send_to_a_missing_topic_creates_nothing(raylog_client, kafka_config):
    topic = f"auto-{uuid.uuid4().hex[:10]}"
    outcomes = _produce(kafka_config, topic, [b"x"], timeout_ms=3000)
    assert len(outcomes) == 1 and outcomes[0] is not None  # not delivered
    assert _metadata(kafka_config, topic, 8) == UNKNOWN_TOPIC_OR_PARTITION
    assert topic not in raylog_client.list_topics()


def test_a_producers_first_send_creates_the_topic_with_the_defaults(raylog_client, kafka_config, auto_create):
    topic = f"auto-{uuid.uuid4().hex[:10]}"
    outcomes = _produce(kafka_config, topic, [b"first", b"second", b"third"])
    assert outcomes == [None, None, None]
    assert topic in raylog_client.list_topics()
    assert len(raylog_client.describe_topic(topic)["partitions"]) == 1
    with raylog_client.consumer(topic, auto_offset_reset="earliest") as consumer:
        values = []
        wait_until(lambda: values.extend(m.value for m in consumer.poll(timeout_ms=1000)) or len(values) >= 3,
                   timeout_s=WAIT_S)
    assert values == [b"first", b"second", b"third"]


@pytest.mark.parametrize("version", [1, 4, 8])
def test_a_metadata_request_answers_leader_not_available_while_the_topic_is_made(raylog_client, kafka_config,
                                                                                  auto_create, version):
    topic = f"auto-{uuid.uuid4().hex[:10]}"
    assert _metadata(kafka_config, topic, version) == LEADER_NOT_AVAILABLE
    wait_until(lambda: _metadata(kafka_config, topic, version) == 0, timeout_s=WAIT_S)
    assert len(raylog_client.describe_topic(topic)["partitions"]) == 1


def test_a_request_that_does_not_allow_creation_and_a_bad_name_create_nothing(raylog_client, kafka_config,
                                                                               auto_create):
    topic = f"auto-{uuid.uuid4().hex[:10]}"
    assert _metadata(kafka_config, topic, 8, allow=False) == UNKNOWN_TOPIC_OR_PARTITION
    assert _metadata(kafka_config, "no/slash " + topic, 8) == INVALID_TOPIC_EXCEPTION
    assert topic not in raylog_client.list_topics()
    with pytest.raises(UnknownTopicError):
        raylog_client.describe_topic(topic)
