"""``raylog consume`` in a group stops on signals without losing its
progress, and commits while idle: the installed script in a subprocess,
against the shared ZooKeeper and the test session's local Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAYLOG_DATA_DIR", "RAY_ADDRESS")
MESSAGES = 10
#: never reached in these tests: only a signal or the idle commit can commit
NEVER_MS = "3600000"


@pytest.fixture(scope="module")
def cluster(zookeeper, raylog_client):
    if not zookeeper.running:
        zookeeper.start()
    return ["--zookeeper", zookeeper.connect_string, "--cluster", raylog_client.settings.cluster]


@pytest.fixture
def filled(make_topic, raylog_client):
    """A one-partition topic holding MESSAGES messages, all flushed: (topic, end)."""
    topic = make_topic(partitions=1, flush_ms=10)
    producer = raylog_client.producer(acks=1)
    for i in range(MESSAGES):
        producer.send(topic, f"v{i}".encode())
    producer.close()
    deadline = time.monotonic() + 60
    while raylog_client.offsets(topic, 0)[1] == 0 or raylog_client.offsets(topic, 0)[1] < _end(raylog_client, topic):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return topic, raylog_client.offsets(topic, 0)[1]


def _end(client, topic) -> int:
    import ray

    return ray.get(client.partition_actor(topic, 0).stats.remote())["log_end_offset"]


def _committed(client, group: str, topic: str) -> int | None:
    rows = [r for r in client.describe_group(group) if r.get("topic") == topic and r.get("partition") == 0]
    return rows[0].get("committed") if rows else None


def _start_consumer(cluster, topic, group, *extra) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    return subprocess.Popen(
        [RAYLOG, *cluster, "consume", topic, "--group", group, "--from-beginning", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )


def _read_lines(proc: subprocess.Popen, n: int) -> list[str]:
    lines = []
    for _ in range(n):  # bounded by the test timeout: a hang is the failure
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode(errors="replace")
        lines.append(line.decode().rstrip("\n"))
    return lines


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_consume_commits_what_it_printed_on_a_signal_and_exits_with_its_code(cluster, filled, raylog_client, sig,
                                                                              code):
    topic, end = filled
    group = f"g-{topic}-{sig.name}"
    proc = _start_consumer(cluster, topic, group, "--auto-commit-interval-ms", NEVER_MS)
    try:
        assert _read_lines(proc, MESSAGES) == [f"v{i}" for i in range(MESSAGES)]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err.decode(errors="replace")
    assert f"consumed {MESSAGES} messages" in err.decode()
    assert b"Traceback" not in err
    assert _committed(raylog_client, group, topic) == end


def test_consume_commits_while_idle_after_the_interval(cluster, filled, raylog_client):
    topic, end = filled
    group = f"g-{topic}-idle"
    proc = _start_consumer(cluster, topic, group, "--auto-commit-interval-ms", "300")
    try:
        assert len(_read_lines(proc, MESSAGES)) == MESSAGES
        # No message comes any more; the commit must come anyway.
        deadline = time.monotonic() + 60
        while _committed(raylog_client, group, topic) != end:
            assert time.monotonic() < deadline, _committed(raylog_client, group, topic)
            assert proc.poll() is None
            time.sleep(0.2)
    finally:
        proc.kill()  # no final commit: what is committed came from the idle loop
        proc.wait()
