"""KafkaJS (Node.js) against raylog's Kafka listener: records with headers
(a key sent twice), a tombstone and an empty value produced and consumed
back through KafkaJS (a consumer group) and read by raylog's consumer. Needs
node and KafkaJS in .tools/node_modules (``make hosts-tools`` installs it
where npm is); skips saying which is missing otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, ".tools", "node_modules")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kafkajs", "headers.js")
WAIT_S = 120.0


@pytest.fixture(scope="module")
def node() -> str:
    found = shutil.which("node")
    if found is None:
        pytest.skip("node is not installed (KafkaJS runs on Node.js)")
    if not os.path.isfile(os.path.join(TOOLS, "kafkajs", "package.json")):
        pytest.skip(f"KafkaJS is not in {TOOLS}: run `make hosts-tools` (needs npm)")
    return found


def test_kafkajs_headers_tombstones_and_empty_values(node, raylog_client, kafka_config):
    topic = f"js-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic, partitions=1)
    run = subprocess.run(
        [node, SCRIPT, kafka_config["bootstrap.servers"], kafka_config["sasl.username"],
         kafka_config["sasl.password"], topic, f"g-{uuid.uuid4().hex[:8]}"],
        capture_output=True, text=True, timeout=WAIT_S, env={**os.environ, "NODE_PATH": TOOLS},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    base = int(lines[0]["produced"])
    read = lines[1:]
    h = lambda text: text.encode().hex()  # noqa: E731
    assert [(int(r["offset"]), r["key"], r["value"], r["headers"]) for r in read] == [
        (base, h("k1"), h("v1"), [["h", h("a")], ["h", h("b")], ["e", ""]]),
        (base + 1, h("k2"), None, [["t", h("x")]]),
        (base + 2, None, "", []),
    ]
    consumer = raylog_client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 3 and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=1000))
    finally:
        consumer.close()
    assert [(m.offset, m.key, m.value, list(m.headers)) for m in got] == [
        (base, b"k1", b"v1", [("h", b"a"), ("h", b"b"), ("e", b"")]),
        (base + 1, b"k2", None, [("t", b"x")]),
        (base + 2, None, b"", []),
    ]


TRANSACTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kafkajs", "transactions.js")


def test_kafkajs_transactions_commit_abort_send_offsets_and_fence_a_zombie(node, raylog_client, kafka_config):
    """KafkaJS's transactional producer through the listener: a committed
    transaction over two partitions with a group's offsets, an aborted one,
    and a zombie fenced by a newer producer of its id; KafkaJS's
    read_committed consumer and raylog's read the committed records alone,
    and the group's offsets are those the committed transaction sent."""
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    topic = f"jstx-{uuid.uuid4().hex[:12]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    raylog_client.create_topic(topic, partitions=2)
    try:
        run = subprocess.run(
            [node, TRANSACTIONS, kafka_config["bootstrap.servers"], kafka_config["sasl.username"],
             kafka_config["sasl.password"], topic, f"js-{topic}", group],
            capture_output=True, text=True, timeout=WAIT_S, env={**os.environ, "NODE_PATH": TOOLS},
        )
    finally:
        stop_transaction_coordinator(raylog_client.settings.cluster)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    assert lines[:2] == [{"committed": True}, {"aborted": True}]
    assert lines[2]["fenced"] in ("INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED"), lines[2]
    read = sorted((r["partition"], r["read"]) for r in lines[3:])
    assert read == [(0, "c-0"), (0, "n-0"), (1, "c-1")]
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest", isolation_level="read_committed")
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 3 and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=500))
        got.extend(consumer.poll(timeout_ms=1000))
    finally:
        consumer.close()
    assert sorted((m.partition, m.value) for m in got) == [(0, b"c-0"), (0, b"n-0"), (1, b"c-1")]
    [row] = [r for r in raylog_client.describe_group(group) if r["partition"] == 0]
    assert row["committed"] == 5
