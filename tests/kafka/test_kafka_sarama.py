"""sarama, the Go Kafka client (Debian's golang-github-shopify-sarama-dev,
1.22), against the front door: ``apps/sarama/main.go`` is built with
Debian's Go and run as a user runs it. It produces records with headers and
null values (SCRAM-SHA-256, acks=all, each codec), reads them back itself
and through raylog's consumer, and consumes in a consumer group whose
commits land in raylog's offsets. The project's set-up (``make venv``)
installs Go and sarama where apt-get is; without them these tests skip and
say so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from raylog.groups.offsets import OffsetStore

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "apps" / "sarama" / "main.go"
GOPATH = "/usr/share/gocode"
SARAMA = Path(GOPATH) / "src" / "github.com" / "Shopify" / "sarama"
WAIT_S = 120

pytestmark = pytest.mark.skipif(
    shutil.which("go") is None or not SARAMA.is_dir(),
    reason="Go and sarama are not installed (make venv installs golang-go and golang-github-shopify-sarama-dev "
           "as root where apt-get is)")


@pytest.fixture(scope="module")
def sarama_client(tmp_path_factory) -> Path:
    """The client, built from apps/sarama with Debian's Go and packages (GOPATH mode, no network)."""
    out = tmp_path_factory.mktemp("sarama")
    binary = out / "sarama-client"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": GOPATH, "GOCACHE": str(out / "cache"),
           "GOFLAGS": "", "CGO_ENABLED": "1"}
    built = subprocess.run(["go", "build", "-o", str(binary), str(SOURCE)], capture_output=True, env=env,
                           timeout=600, cwd=SOURCE.parent)
    assert built.returncode == 0, built.stderr.decode()[-3000:]
    return binary


def _run(binary: Path, config: dict, command: str, topic: str, count: int, **extra) -> list[dict]:
    env = {**os.environ, "KAFKA_BROKERS": config["bootstrap.servers"], "TOPIC": topic, "COUNT": str(count),
           "KAFKA_USER": config.get("sasl.username", ""), "KAFKA_PASSWORD": config.get("sasl.password", ""),
           **{k.upper(): v for k, v in extra.items()}}
    done = subprocess.run([str(binary), command], capture_output=True, env=env, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def _expected(count: int) -> list[tuple]:
    return [(f"k{i}", None if i % 5 == 4 else f"v{i}", {"trace": str(i), "kind": "go"}) for i in range(count)]


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_sarama_produces_headers_and_nulls_and_reads_them_back(raylog_client, kafka_config, sarama_client,
                                                               compression):
    topic = f"sarama-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=1)
    sent = _run(sarama_client, kafka_config, "produce", topic, 20, compression=compression)
    assert len(sent) == 20 and [s["offset"] for s in sent] == sorted({s["offset"] for s in sent})
    read = _run(sarama_client, kafka_config, "consume", topic, 20)
    assert [(r["key"], r["value"], r["headers"]) for r in read] == _expected(20)
    assert [r["offset"] for r in read] == [s["offset"] for s in sent]
    # raylog's own consumer sees the same records, null values as None
    with raylog_client.consumer(topic, auto_offset_reset="earliest") as consumer:
        got = []
        for _ in range(200):
            got.extend(consumer.poll(timeout_ms=200))
            if len(got) >= 20:
                break
    assert [(m.offset, m.key, m.value, [(k, v) for k, v in m.headers]) for m in got] == [
        (s["offset"], k.encode(), None if v is None else v.encode(), [("trace", h["trace"].encode()),
                                                                      ("kind", b"go")])
        for s, (k, v, h) in zip(sent, _expected(20))]


def test_a_sarama_consumer_group_commits_to_raylogs_offsets(raylog_client, kafka_config, sarama_client):
    topic, group = f"sarama-{uuid.uuid4().hex[:10]}", f"sg-{uuid.uuid4().hex[:8]}"
    raylog_client.create_topic(topic, partitions=1)
    sent = _run(sarama_client, kafka_config, "produce", topic, 10)
    read = _run(sarama_client, kafka_config, "group", topic, 10, group=group)
    assert [(r["key"], r["value"]) for r in read] == [(k, v) for k, v, _ in _expected(10)]
    # the commit on leaving: the next offset after the last message read
    committed = OffsetStore(raylog_client._zk, raylog_client.settings.cluster).committed(group, topic, 0)
    assert committed is not None and committed > sent[-1]["offset"]
