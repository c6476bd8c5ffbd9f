"""TLS on the Kafka listener (:mod:`raylog.kafka.tls`): the module's
cluster runs its listener with the files ``raylog tls init`` made, and
Kafka clients reach it over SASL_SSL with what ``client.kafka_config()``
gives -- confluent-kafka with SCRAM-SHA-512, -256 and PLAIN, kafka-python in
its own names, aiokafka with its ``ssl_context`` -- while a plaintext client and a client trusting another CA
are refused with nothing stored. A fetch of a large record set goes through
TLS (not ``sendfile``) and returns the stored bytes. Real ZooKeeper, Ray,
listener and clients; the TLS blocks of docs/howto/kafka.md run as
written (the embedded default with ``kafka_tls``, in a fresh interpreter)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import stat
import struct
import subprocess
import sys
import time
import uuid

import pytest
from kafka_reads import raylog_read

from tests.doc_blocks import block, printed_lines, run_example

import raylog
from raylog.errors import ConfigError

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

WAIT_S = 60.0


@pytest.fixture(scope="module", autouse=True)
def ca_files_here(tmp_path_factory):
    """kafka_config()'s CA files (and the examples') under the module's own cache directory."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory):
    """The files ``raylog tls init DIR`` makes (run as the command line runs it)."""
    from raylog.tools.cli import run

    directory = tmp_path_factory.mktemp("tls") / "certs"
    assert run(["tls", "init", str(directory), "--host", "127.0.0.2"]) == 0
    return directory


@pytest.fixture(scope="module")
def tls_listeners(raylog_client, tls_dir):
    entries = raylog_client.start_kafka_listeners(tls=raylog.TlsSettings.in_dir(tls_dir))
    assert entries and all(e["security_protocol"] == "SASL_SSL" for e in entries)
    return entries


def _topic(raylog_client, partitions: int = 1) -> str:
    name = f"tls-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(name, partitions=partitions)
    return name


def _produce(config: dict, topic: str, values) -> list:
    """Produce ``values`` to partition 0 with confluent-kafka; the delivery errors (None each when stored)."""
    results = []
    producer = confluent_kafka.Producer({**config, "message.timeout.ms": 15000})
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=lambda err, msg: results.append(err))
    producer.flush(WAIT_S)
    return results


def _consume(config: dict, topic: str, n: int, **settings) -> list:
    consumer = confluent_kafka.Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                         "enable.auto.commit": False, "fetch.wait.max.ms": 100, **settings})
    got = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + WAIT_S
        while len(got) < n and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                assert msg.error() is None, msg.error()
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def _failures(config: dict, topic: str, wait_s: float = 20.0) -> list:
    """The client errors of a producer of ``config`` that tries to send one message for ``wait_s``."""
    errors = []
    producer = confluent_kafka.Producer({**config, "error_cb": errors.append, "message.timeout.ms": int(wait_s * 1000)})
    producer.produce(topic, b"never", partition=0)
    deadline = time.monotonic() + wait_s
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    producer.purge()
    producer.flush(5)
    return errors


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_confluent_kafka_over_sasl_ssl_produces_and_consumes(raylog_client, tls_listeners, tls_dir, mechanism):
    config = raylog_client.kafka_config(mechanism=mechanism)
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.mechanisms"] == mechanism
    assert config["ssl.ca.location"].startswith(os.environ["XDG_CACHE_HOME"])
    with open(config["ssl.ca.location"]) as registered:  # the CA the listener registered, as a file here
        assert registered.read() == (tls_dir / "ca.pem").read_text()
    topic = _topic(raylog_client)
    values = [b"%s-%d" % (mechanism.encode(), i) for i in range(20)]
    assert _produce(config, topic, values) == [None] * 20
    assert _consume(config, topic, 20) == values
    assert [m.value for m in raylog_read(raylog_client, topic, 20)] == values


def test_kafka_python_over_sasl_ssl_takes_its_dialect_as_it_is(raylog_client, tls_listeners):
    settings = raylog_client.kafka_config(dialect="kafka-python", mechanism="SCRAM-SHA-512")
    assert settings["security_protocol"] == "SASL_SSL" and os.path.exists(settings["ssl_cafile"])
    topic = _topic(raylog_client)
    producer = kafka.KafkaProducer(**settings)
    try:
        for i in range(5):
            producer.send(topic, value=b"kp-%d" % i, partition=0).get(WAIT_S)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(**settings, enable_auto_commit=False, consumer_timeout_ms=int(WAIT_S * 1000))
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        got = [next(consumer).value for _ in range(5)]
    finally:
        consumer.close()
    assert got == [b"kp-%d" % i for i in range(5)]


def test_aiokafka_over_sasl_ssl_takes_its_dialect_as_it_is(raylog_client, tls_listeners):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    settings = raylog_client.kafka_config(dialect="aiokafka", mechanism="SCRAM-SHA-512")
    assert settings["security_protocol"] == "SASL_SSL" and isinstance(settings["ssl_context"], ssl.SSLContext)
    topic = _topic(raylog_client)

    async def round_trip():
        producer = AIOKafkaProducer(**settings)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, b"aio-%d" % i, partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**settings, group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            await consumer.seek_to_beginning()
            return [(await consumer.getone()).value for _ in range(5)]
        finally:
            await consumer.stop()

    assert asyncio.run(asyncio.wait_for(round_trip(), WAIT_S)) == [b"aio-%d" % i for i in range(5)]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (make venv installs it as root)")
def test_kcat_over_sasl_ssl_takes_each_setting_with_x(raylog_client, tls_listeners):
    """Debian's kcat (librdkafka 2.0), every pair of kafka_config() as ``-X key=value``."""
    config = raylog_client.kafka_config(mechanism="SCRAM-SHA-512")
    settings = [arg for key, value in config.items() if key != "bootstrap.servers" for arg in ("-X", f"{key}={value}")]
    topic = _topic(raylog_client)
    lines = [f"user-{i}:click {i}" for i in range(10)]
    produced = subprocess.run(["kcat", "-b", config["bootstrap.servers"], *settings, "-P", "-t", topic, "-p", "0",
                               "-K", ":"], input="\n".join(lines).encode() + b"\n", capture_output=True,
                              timeout=WAIT_S)
    assert produced.returncode == 0, produced.stderr.decode()[-2000:]
    consumed = subprocess.run(["kcat", "-b", config["bootstrap.servers"], *settings, "-C", "-t", topic, "-p", "0",
                               "-o", "beginning", "-e", "-f", "%k:%s\\n"], capture_output=True, timeout=WAIT_S)
    assert consumed.returncode == 0, consumed.stderr.decode()[-2000:]
    assert consumed.stdout.decode().splitlines() == lines


def test_a_plaintext_client_to_the_tls_port_is_refused_and_nothing_is_stored(raylog_client, tls_listeners):
    topic = _topic(raylog_client)
    config = raylog_client.kafka_config()
    plaintext = {k: v for k, v in config.items() if not k.startswith("ssl.")}
    errors = _failures({**plaintext, "security.protocol": "SASL_PLAINTEXT"}, topic)
    assert errors, "a plaintext client got no error from a TLS listener"
    assert raylog_client.offsets(topic, 0) == (0, 0)
    # on the wire: a plaintext ApiVersions gets no Kafka answer, only the connection closed
    host, port = config["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        body = struct.pack(">hhih", 18, 0, 7, 1) + b"x"
        sock.sendall(struct.pack(">i", len(body)) + body)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:  # closed with the request unread
            pass
        assert answer == b"" or (answer[:1] == b"\x15" and len(answer) <= 7), answer  # at most a TLS alert
    # the TLS clients are served as before
    assert _produce(config, topic, [b"after"]) == [None]


def test_a_client_that_trusts_another_ca_is_refused(raylog_client, tls_listeners, tmp_path):
    other = raylog.TlsSettings.make(tmp_path / "other")
    topic = _topic(raylog_client)
    errors = _failures({**raylog_client.kafka_config(), "ssl.ca.location": other.ca}, topic)
    assert any(e.code() in (confluent_kafka.KafkaError._SSL, confluent_kafka.KafkaError._TRANSPORT,
                            confluent_kafka.KafkaError._ALL_BROKERS_DOWN) for e in errors), errors
    assert any("certificate verify failed" in e.str() or "SSL handshake failed" in e.str() for e in errors), errors
    assert raylog_client.offsets(topic, 0) == (0, 0)


def test_raylog_tls_init_makes_files_a_client_verifies(raylog_client, tls_listeners, tls_dir):
    from raylog.tools.cli import run

    for name in ("ca.key", "server.key"):  # the keys are their owner's only
        assert stat.S_IMODE(os.stat(tls_dir / name).st_mode) == 0o600
    entry = tls_listeners[0]
    for name in ("127.0.0.1", "localhost"):  # each name the certificate holds verifies
        context = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
        with socket.create_connection((entry["host"], entry["port"]), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=name) as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    context = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    with socket.create_connection((entry["host"], entry["port"]), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):  # a name it does not hold
            context.wrap_socket(raw, server_hostname="elsewhere.example")
    # a second init into the same directory writes nothing and says why
    before = {p.name: p.read_bytes() for p in tls_dir.iterdir()}
    assert run(["tls", "init", str(tls_dir)]) == 2
    assert {p.name: p.read_bytes() for p in tls_dir.iterdir()} == before


def test_a_large_fetch_over_tls_returns_the_stored_bytes(raylog_client, tls_listeners):
    import ray

    from raylog.config import NAMESPACE
    from raylog.kafka.service import listener_name

    topic = _topic(raylog_client)
    values = [os.urandom(64 * 1024) for _ in range(96)]  # 6 MiB: file ranges of many TLS records
    with raylog_client.producer(batch_size=1 << 20) as producer:
        for value in values:
            producer.send(topic, value, partition=0)
        producer.flush(WAIT_S)
    actor = ray.get_actor(listener_name(raylog_client.settings.cluster, tls_listeners[0]["node"]),
                          namespace=NAMESPACE)
    before = ray.get(actor.stats.remote(), timeout=WAIT_S)["fetch_bytes_sent_from_files"]
    got = _consume(raylog_client.kafka_config(), topic, len(values), **{"fetch.max.bytes": 8 << 20,
                                                                        "max.partition.fetch.bytes": 8 << 20})
    assert got == values
    # the bytes came from the segment file, through the TLS socket
    assert ray.get(actor.stats.remote(), timeout=WAIT_S)["fetch_bytes_sent_from_files"] - before >= 6 << 20


def test_tls_settings_that_cannot_be_used_are_refused_before_anything_starts(raylog_client, tls_dir, tmp_path):
    with pytest.raises(ConfigError, match="cannot be used"):
        raylog_client.start_kafka_listeners(tls=raylog.TlsSettings(tls_dir / "server.pem", tmp_path / "missing.key"))
    with pytest.raises(ConfigError, match="must be a raylog.TlsSettings"):
        raylog_client.start_kafka_listeners(tls=str(tls_dir))


def test_the_tls_blocks_of_the_kafka_page_run_as_written(tmp_path):
    page, heading = "docs/howto/kafka.md", "TLS (SASL_SSL)"
    bin_dir = os.path.dirname(sys.executable)  # the page calls raylog
    made = run_example(block(page, heading, "bash"), tmp_path, env={"PATH": bin_dir + os.pathsep + os.environ["PATH"]},
                       command=["bash", "-eo", "pipefail"])
    assert made.returncode == 0, made.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "certs").iterdir()) == ["ca.key", "ca.pem", "server.key", "server.pem"]
    proc = run_example(block(page, heading, "python", index=1), tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert printed_lines(proc.stdout) == ["SASL_SSL b'hello over TLS'"], proc.stdout
