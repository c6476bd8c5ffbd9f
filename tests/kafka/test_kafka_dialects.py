"""``client.kafka_config(dialect=...)``: the settings in each client's own
names, taken as they are -- kafka-python's ``KafkaProducer(**config)``,
aiokafka's ``AIOKafkaProducer(**config)``, confluent-kafka's
``Producer(config)`` -- each producing to raylog through the Kafka front
door, read back with raylog's consumer; the Java client's names checked by
form. On real ZooKeeper, Ray and sockets."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kafka_reads import raylog_read

from raylog.errors import ConfigError
from raylog.kafka.dialects import in_dialect

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

WAIT_S = 60.0


def _topic(raylog_client) -> str:
    name = f"d-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(name, partitions=1)
    return name


def test_kafka_python_takes_its_dialect_as_it_is(raylog_client, listeners):
    topic = _topic(raylog_client)
    producer = kafka.KafkaProducer(**raylog_client.kafka_config(dialect="kafka-python"))
    try:
        for i in range(5):
            producer.send(topic, value=b"kp-%d" % i, partition=0).get(WAIT_S)
    finally:
        producer.close()
    assert [m.value for m in raylog_read(raylog_client, topic, 5)] == [b"kp-%d" % i for i in range(5)]


def test_aiokafka_takes_its_dialect_as_it_is(raylog_client, listeners):
    from aiokafka import AIOKafkaProducer

    topic = _topic(raylog_client)
    config = raylog_client.kafka_config(dialect="aiokafka")

    async def produce():
        producer = AIOKafkaProducer(**config)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, b"aio-%d" % i, partition=0)
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(produce(), WAIT_S))
    assert [m.value for m in raylog_read(raylog_client, topic, 5)] == [b"aio-%d" % i for i in range(5)]


def test_librdkafka_is_the_default_dialect(raylog_client, listeners):
    assert raylog_client.kafka_config(dialect="librdkafka") == raylog_client.kafka_config()


def test_the_java_dialect_names_scrams_login_module_with_the_token():
    config = {"bootstrap.servers": "10.0.0.1:9092,10.0.0.2:9092", "security.protocol": "SASL_PLAINTEXT",
              "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "prod", "sasl.password": "ab12"}
    assert in_dialect(config, "java") == {
        "bootstrap.servers": "10.0.0.1:9092,10.0.0.2:9092", "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="prod" password="ab12";'}
    opened = {"bootstrap.servers": "h:1", "security.protocol": "PLAINTEXT"}
    assert in_dialect(opened, "java") == opened
    assert in_dialect(opened, "kafka-python") == {"bootstrap_servers": ["h:1"], "security_protocol": "PLAINTEXT"}
    assert in_dialect(opened, "aiokafka") == {"bootstrap_servers": "h:1", "security_protocol": "PLAINTEXT"}


def test_over_tls_each_dialect_names_the_ca_file_in_its_own_way(tmp_path):
    import ssl

    import raylog

    ca = raylog.TlsSettings.make(tmp_path).ca
    config = {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "ssl.ca.location": ca,
              "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "prod", "sasl.password": "ab12"}
    assert in_dialect(config, "java") == {
        "bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="prod" password="ab12";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": ca}
    assert in_dialect({**config, "sasl.mechanisms": "PLAIN"}, "java")["sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required ")
    assert in_dialect(config, "kafka-python") == {
        "bootstrap_servers": ["h:1"], "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "prod", "sasl_plain_password": "ab12", "ssl_cafile": ca}
    aio = in_dialect(config, "aiokafka")
    context = aio.pop("ssl_context")
    assert aio == {"bootstrap_servers": "h:1", "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                   "sasl_plain_username": "prod", "sasl_plain_password": "ab12"}
    assert isinstance(context, ssl.SSLContext) and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "raylog Kafka listeners CA"),),)]


def test_an_unknown_dialect_is_refused_naming_the_dialects(raylog_client):
    with pytest.raises(ConfigError, match="'librdkafka', 'java', 'kafka-python', 'aiokafka'.*got 'sarama'"):
        raylog_client.kafka_config(dialect="sarama")
