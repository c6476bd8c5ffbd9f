"""kcat (Debian's, on its own librdkafka) produces to and consumes from the
front door, and lists its metadata; and a SASL handshake of version 0 (the
SCRAM tokens as bare frames, before SaslAuthenticate existed) authenticates.
kcat is installed by the project's set-up (``make venv``) where apt-get is;
without it the kcat tests skip and say so."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse
from kafka_raw import RawKafka
from scramp import ScramClient

WAIT_S = 60

kcat_missing = pytest.mark.skipif(shutil.which("kcat") is None,
                                  reason="kcat is not installed (make venv installs it as root where apt-get is)")


def _kcat(config: dict, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    settings = ["-X", f"security.protocol={config['security.protocol']}"]
    if "sasl.mechanisms" in config:
        settings += ["-X", f"sasl.mechanisms={config['sasl.mechanisms']}", "-X",
                     f"sasl.username={config['sasl.username']}", "-X", f"sasl.password={config['sasl.password']}"]
    return subprocess.run(["kcat", "-b", config["bootstrap.servers"], *settings, *args], input=stdin,
                          capture_output=True, timeout=WAIT_S)


@kcat_missing
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_kcat_produces_and_consumes_and_raylog_reads_what_it_wrote(raylog_client, kafka_config, compression):
    topic = f"kcat-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=1)
    lines = [f"user-{i % 3}:click {i}" for i in range(20)]
    produced = _kcat(kafka_config, "-P", "-t", topic, "-p", "0", "-K", ":", "-z", compression,
                     stdin="\n".join(lines).encode() + b"\n")
    assert produced.returncode == 0, produced.stderr.decode()[-2000:]
    consumed = _kcat(kafka_config, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-f", "%o %k %s\\n")
    assert consumed.returncode == 0, consumed.stderr.decode()[-2000:]
    rows = [line.split(" ", 2) for line in consumed.stdout.decode().splitlines()]
    assert [f"{k}:{v}" for _, k, v in rows] == lines
    offsets = [int(o) for o, _, _ in rows]
    assert offsets == sorted(set(offsets))
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = []
    for _ in range(100):
        got.extend(consumer.poll(timeout_ms=200))
        if len(got) >= len(lines):
            break
    consumer.close()
    assert [(m.offset, m.key, m.value) for m in got] == [
        (o, k.encode(), v.encode()) for o, (_, k, v) in zip(offsets, rows)]


@kcat_missing
def test_kcat_lists_the_topic_and_its_leader(raylog_client, kafka_config):
    topic = f"kcat-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=3)
    listed = _kcat(kafka_config, "-L", "-t", topic)
    assert listed.returncode == 0, listed.stderr.decode()[-2000:]
    text = listed.stdout.decode()
    assert f'topic "{topic}" with 3 partitions' in text
    assert text.count("leader ") == 3


def test_a_version_0_sasl_handshake_takes_the_tokens_as_bare_frames(kafka_config):
    with RawKafka(kafka_config) as raw:
        answer = raw.request(SaslHandshakeRequest[0](mechanism="SCRAM-SHA-256"), SaslHandshakeResponse)
        assert answer.error_code == 0
        client = ScramClient(["SCRAM-SHA-256"], kafka_config["sasl.username"], kafka_config["sasl.password"])
        raw.send_raw(client.get_client_first().encode())
        client.set_server_first(raw.read_frame().decode())
        raw.send_raw(client.get_client_final().encode())
        client.set_server_final(raw.read_frame().decode())  # the listener proved the token too
        metadata = raw.request(MetadataRequest[1](topics=None), MetadataResponse)
        assert metadata.brokers


def test_a_wrong_token_over_a_version_0_handshake_closes_the_connection(kafka_config):
    with RawKafka(kafka_config) as raw:
        raw.request(SaslHandshakeRequest[0](mechanism="SCRAM-SHA-256"), SaslHandshakeResponse)
        client = ScramClient(["SCRAM-SHA-256"], kafka_config["sasl.username"], "not-the-token")
        raw.send_raw(client.get_client_first().encode())
        client.set_server_first(raw.read_frame().decode())
        raw.send_raw(client.get_client_final().encode())
        assert raw.read_frame() is None


def _stored_codecs(kafka_config, topic: str) -> list[int]:
    """The codec bits of every batch of partition 0, as stored: a Fetch
    sends the stored batches as they are (docs/design.md section 10)."""
    from kafka.protocol.consumer import FetchRequest, FetchResponse

    FetchTopic = FetchRequest.FetchTopic
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        answer = raw.request(FetchRequest[4](
            replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
            topics=[FetchTopic(topic=topic, partitions=[FetchTopic.FetchPartition(
                partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]), FetchResponse)
    data = bytes(answer.responses[0].partitions[0].records or b"")
    codecs, pos = [], 0
    while len(data) - pos >= 61:
        codecs.append(int.from_bytes(data[pos + 21:pos + 23], "big") & 7)
        pos += 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
    return codecs


@kcat_missing
@pytest.mark.parametrize("compression, codec", [("gzip", 1), ("lz4", 3)])
def test_kcats_old_librdkafka_compresses_what_it_sends(raylog_client, kafka_config, compression, codec):
    """Debian's kcat is on librdkafka 2.0, which sends uncompressed batches
    without a word unless Produce 2 and Fetch 2 are advertised (its
    "MsgVer1" feature): they are, so its batches are stored compressed."""
    topic = f"kcat-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=1)
    lines = [f"line {i} " + "x" * 40 for i in range(50)]
    produced = _kcat(kafka_config, "-P", "-t", topic, "-p", "0", "-z", compression,
                     stdin="\n".join(lines).encode() + b"\n")
    assert produced.returncode == 0, produced.stderr.decode()[-2000:]
    codecs = _stored_codecs(kafka_config, topic)
    assert codecs and set(codecs) == {codec}, codecs


def test_a_produce_below_the_served_versions_is_refused(raylog_client, kafka_config):
    """Produce 0-2 are advertised, never served: such a request closes the
    connection (nothing stored), as any version not served does."""
    import struct

    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    topic = f"kcat-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=1)
    with RawKafka(kafka_config) as raw:
        versions = raw.request(ApiVersionsRequest[0](), ApiVersionsResponse)
        ranges = {k[0]: (k[1], k[2]) for k in versions.api_keys}
        assert ranges[0] == (0, 9) and ranges[1] == (0, 12)  # Produce and Fetch advertised from version 0
        raw.authenticate()
        # Produce v2: header, acks 1, timeout, one topic with one empty message set
        name = topic.encode()
        raw.send_raw(struct.pack(">hhih", 0, 2, 7, 3) + b"old" + struct.pack(">hii", 1, 1000, 1)
                     + struct.pack(">h", len(name)) + name + struct.pack(">iii", 1, 0, 0))
        assert raw.read_frame() is None  # closed
    assert raylog_client.end_offsets(topic) == {0: 0}
