"""The embedded default starts its Kafka listeners (docs/design.md section
10): ``raylog.connect()`` and then, with no other call, a Kafka client
from ``client.kafka_config()`` produces, creates a topic and reads back.
The script runs in a fresh interpreter (its own Ray and ZooKeeper): this
process may already hold a Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(600)

_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAY_ADDRESS")

SCRIPT = textwrap.dedent(
    """
    import json
    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic
    import raylog

    client = raylog.connect()
    try:
        config = client.kafka_config()  # no start_kafka_listeners(): connect() started them
        admin = AdminClient(config)
        admin.create_topics([NewTopic("made-by-kafka", num_partitions=2)],
                            operation_timeout=120)["made-by-kafka"].result(timeout=120)
        producer = confluent_kafka.Producer(config)
        for i in range(5):
            producer.produce("made-by-kafka", f"v{i}".encode(), partition=1)
        assert producer.flush(60) == 0
        consumer = client.consumer(["made-by-kafka"], group="g", auto_offset_reset="earliest")
        got = []
        for _ in range(60):
            got.extend(m.value.decode() for m in consumer.poll(timeout_ms=1000))
            if len(got) >= 5:
                break
        consumer.close()
        print(json.dumps({"servers": config["bootstrap.servers"], "topics": client.list_topics(), "got": got}))
    finally:
        client.close()
    """
)


def test_the_embedded_default_serves_kafka_clients_without_another_call():
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=540)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    found = json.loads(lines[-1])
    assert found["servers"].startswith("127.0.0.1:")
    assert found["topics"] == ["made-by-kafka"]
    assert found["got"] == [f"v{i}" for i in range(5)]
