"""``raylog consume --print-headers`` / ``--null-literal`` and ``raylog
produce --header``: the installed script in a subprocess (shared ZooKeeper,
the session's Ray, a real partition actor) over a log of format-1 messages
followed by format-2 batches (tests/format2_log.py)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time

import pytest

from format2_log import expected, mixed_log
from raylog.producer.producer import Producer

pytestmark = pytest.mark.timeout(300)

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAYLOG_DATA_DIR", "RAY_ADDRESS")


@pytest.fixture(scope="module")
def cluster(zookeeper, raylog_client):
    if not zookeeper.running:
        zookeeper.start()
    return ["--zookeeper", zookeeper.connect_string, "--cluster", raylog_client.settings.cluster]


def _raylog(cluster, *args, input: bytes = b"") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    return subprocess.run([RAYLOG, *cluster, *args], input=input, capture_output=True, env=env, timeout=300)


def test_consume_prints_headers_and_a_null_value_apart_from_an_empty_one(cluster, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain, positions = mixed_log(raylog_client, topic)
    n = len(expected(plain, positions))
    proc = _raylog(cluster, "consume", topic, "--from-beginning", "--max-messages", str(n), "--timeout-ms", "5000",
                   "--print-headers", "--print-key")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().split("\n") == [
        "Headers:\tnull\tplain-0",
        "Headers:\tnull\tplain-1",
        "Headers:h=1,h=2,n\tk0\tv0",  # in order, duplicates kept, a null header value as its key alone
        "Headers:\tnull\tNULL",  # a tombstone
        "Headers:e=\tk2\t",  # an empty value (and an empty header value)
        "Headers:i=0\tk0\tb0", "Headers:i=1\tk1\tb1", "Headers:i=2\tk2\tb2", "Headers:i=3\tk3\tb3",
        "",
    ]
    # the null literal is chosen; without --print-headers nothing of them is printed
    proc = _raylog(cluster, "consume", topic, "--from-beginning", "--max-messages", str(n), "--timeout-ms", "5000",
                   "--null-literal", "<tombstone>")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().split("\n")[2:6] == ["v0", "<tombstone>", "", "b0"]


def test_produce_refuses_a_header_without_equals(cluster, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    proc = _raylog(cluster, "produce", topic, "--header", "novalue", input=b"a\n")
    assert proc.returncode != 0
    assert "KEY=VALUE" in proc.stderr.decode()
    assert raylog_client.offsets(topic, 0)[1] == 0  # nothing sent


@pytest.mark.xfail("headers" not in inspect.signature(Producer.send).parameters, strict=True,
                   reason="the producer's send(headers=...) has not landed on this branch yet")
def test_produce_sends_header_options_with_every_line(cluster, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    proc = _raylog(cluster, "produce", topic, "--header", "trace=abc", "--header", "trace=def", "--header", "e=",
                   input=b"one\ntwo\n")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < 2:
            assert time.monotonic() < deadline, "the produced lines never arrived"
            got += consumer.poll(timeout_ms=1000, max_messages=2 - len(got))
    finally:
        consumer.close()
    assert [(m.value, list(m.headers)) for m in got] == [
        (b"one", [("trace", b"abc"), ("trace", b"def"), ("e", b"")]),
        (b"two", [("trace", b"abc"), ("trace", b"def"), ("e", b"")]),
    ]
