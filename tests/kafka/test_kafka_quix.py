"""Quix Streams, a stateful stream processor, against raylog's Kafka front door
(issue 46): ``apps/quix/count_by_key.py`` counts messages per key in Quix's
state with ``processing_guarantee="at-least-once"``; Quix makes its changelog
topic (``cleanup.policy=compact``) and its output topic through the front door.
The app runs once over 10,000 messages, its local state is deleted, more
messages come, and the app runs again: it restores its state from the
changelog, and the last count of each key on the output topic is the number
of messages of that key.

The app runs as a subprocess of the Quix venv's python (``.venv-apps/quix``,
made by ``make venv-quix`` from ``apps/quix/constraints.txt``: Quix Streams
pins confluent-kafka and pydantic below the project's own pins), with a
timeout, killed on failure; raylog's cluster and listeners run in this
interpreter (real ZooKeeper, Ray, partitions, listeners). Without that venv
(no package index where it was set up) the tests skip and say why."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter

import pytest

from tests.doc_blocks import block

confluent_kafka = pytest.importorskip("confluent_kafka")

from tests.kafka import stream_apps  # noqa: E402 (needs confluent_kafka)

pytestmark = pytest.mark.timeout(900)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUIX_VENV = os.path.join(ROOT, ".venv-apps", "quix")
QUIX_CONSTRAINTS = os.path.join(ROOT, "apps", "quix", "constraints.txt")
APP = os.path.join(ROOT, "apps", "quix", "count_by_key.py")
WAIT_S = 120.0
#: how long one run of the app may take (its start, rebalance, recovery and processing)
RUN_S = 420.0
MESSAGES = 10_000
MORE = 2_000
KEYS = 20
PARTITIONS = 4


def quix_venv_unavailable(venv: str = QUIX_VENV, constraints: str = QUIX_CONSTRAINTS) -> str | None:
    """Why the Quix venv cannot be used (``None``: it can): absent, or made from
    another ``apps/quix/constraints.txt`` than the checkout's."""
    return stream_apps.venv_unavailable(venv, constraints, "Quix Streams", "venv-quix")


@pytest.fixture(scope="module")
def quix_python() -> str:
    reason = quix_venv_unavailable()
    if reason:
        pytest.skip(reason)
    return os.path.join(QUIX_VENV, "bin", "python")


def run_app(python: str, config: dict, workdir, name: str) -> tuple[int, str]:
    """Run the app to its end: ``(messages processed, its log)`` (killed
    when it overruns :data:`RUN_S` or the test stops)."""
    out, log = stream_apps.run_app(python, APP, config, workdir, name, RUN_S)
    return out["processed"], log


def produce(config: dict, topic: str, start: int, n: int) -> Counter:
    """``n`` JSON messages over :data:`KEYS` keys; their number per key."""
    return stream_apps.produce(config, topic, start, n, KEYS)


output_counts = stream_apps.output_counts
last_counts = stream_apps.last_counts


def test_quix_counts_per_key_survive_a_restart_from_the_changelog(quix_python, raylog_client, kafka_config,
                                                                   tmp_path):
    name = uuid.uuid4().hex[:8]
    source, sink, group = f"quix-in-{name}", f"quix-out-{name}", f"quix-{name}"
    raylog_client.create_topic(source, partitions=PARTITIONS)
    state_dir = tmp_path / "state"
    config = {"kafka": kafka_config, "input": source, "output": sink, "consumer_group": group,
              "state_dir": str(state_dir), "idle_timeout_s": 60.0}

    expected = produce(kafka_config, source, 0, MESSAGES)
    processed, _ = run_app(quix_python, {**config, "count": MESSAGES}, tmp_path, "first")
    assert processed == MESSAGES
    counts, records = last_counts(kafka_config, sink)
    assert counts == dict(expected) and records == MESSAGES

    # Quix's changelog of the count: made by Quix through the front door, compacted, one partition
    # a partition of the input
    changelogs = [t for t in raylog_client.list_topics() if t.startswith("changelog") and group in t]
    assert len(changelogs) == 1, raylog_client.list_topics()
    described = raylog_client.describe_topic(changelogs[0])["config"]
    assert described.partitions == PARTITIONS and described.cleanup_policy == "compact", described

    # the local state is lost; the app must take it back from the changelog
    shutil.rmtree(state_dir)
    expected += produce(kafka_config, source, MESSAGES, MORE)
    processed, log = run_app(quix_python, {**config, "count": MORE}, tmp_path, "second")
    assert processed == MORE
    assert "Recovery successful" in log, log[-4000:]
    counts, records = last_counts(kafka_config, sink)
    assert counts == dict(expected), {k: (counts.get(k), n) for k, n in expected.items() if counts.get(k) != n}
    assert records == MESSAGES + MORE


def test_quix_restores_from_a_changelog_the_cleaner_compacted(quix_python, raylog_client, kafka_config, tmp_path):
    """The same restart, from a changelog the partition's cleaner has compacted
    (many values of few keys, small segments): Quix reads the kept records
    across the cleaner's gaps and the counts are right. The changelog is made
    beforehand under the name Quix gives it, so that its segments are small;
    Quix takes a topic that exists as it is."""
    name = uuid.uuid4().hex[:8]
    source, sink, group = f"quix-in-{name}", f"quix-out-{name}", f"quix-{name}"
    raylog_client.create_topic(source, partitions=1)
    changelog = f"changelog__{group}--{source}--default"
    raylog_client.create_topic(changelog, partitions=1, cleanup_policy="compact", segment_bytes=16384,
                               max_message_bytes=8192, min_cleanable_dirty_ratio=0.01)
    state_dir = tmp_path / "state"
    config = {"kafka": kafka_config, "input": source, "output": sink, "consumer_group": group,
              "state_dir": str(state_dir), "idle_timeout_s": 60.0, "commit_every": 20}
    first = 4_000
    expected = produce(kafka_config, source, 0, first)
    processed, _ = run_app(quix_python, {**config, "count": first}, tmp_path, "first")
    assert processed == first
    written = raylog_client.offsets(changelog, 0)[1]

    # the cleaner (every 15 s at most) cleans the closed segments: wait for their offset indexes and
    # for fewer records than were written
    directory = raylog_client.registry.placement(changelog, 0)["log_dir"]
    consumer_config = {**kafka_config, "group.id": f"check-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    deadline = time.monotonic() + 240
    while True:
        cleaned = [n for n in os.listdir(directory) if n.endswith(".index")]
        kept = _count_records(consumer_config, changelog)
        if cleaned and kept < first // 4:
            break
        assert time.monotonic() < deadline, f"the cleaner did not clean the changelog ({kept} records, {cleaned})"
        time.sleep(3)
    assert raylog_client.offsets(changelog, 0)[1] == written  # offsets never change

    shutil.rmtree(state_dir)
    expected += produce(kafka_config, source, first, 500)
    processed, log = run_app(quix_python, {**config, "count": 500}, tmp_path, "second")
    assert processed == 500 and "Recovery successful" in log, log[-4000:]
    counts, records = last_counts(kafka_config, sink)
    assert counts == dict(expected) and records == first + 500


def _count_records(config: dict, topic: str) -> int:
    """How many records partition 0 of ``topic`` holds, read to its end."""
    consumer = confluent_kafka.Consumer(config)
    tp = confluent_kafka.TopicPartition(topic, 0)
    count = 0
    try:
        end = consumer.get_watermark_offsets(tp, timeout=WAIT_S)[1]
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + WAIT_S
        while consumer.position([tp])[0].offset < end:
            count += sum(m.error() is None for m in consumer.consume(1000, timeout=1.0))
            assert time.monotonic() < deadline, f"{topic} was not read to its end"
    finally:
        consumer.close()
    return count


def test_the_kafka_page_shows_the_app_these_tests_run():
    """docs/howto/kafka.md's Quix block is apps/quix/count_by_key.py's code, word
    for word (its docstring aside): the test above runs what the page shows."""
    with open(APP) as f:
        source = f.read()
    shown = block("docs/howto/kafka.md", "Stream processors: Quix Streams")
    assert shown.strip() and source.rstrip("\n").endswith(shown.rstrip("\n"))
    assert shown.startswith("import json")


def committed_counts(config: dict, topic: str) -> dict[str, list[int]]:
    """Every count of each key on the output topic as a read_committed reader gets them, in order."""
    return output_counts(config, topic, "read_committed")


def test_quix_exactly_once_counts_each_message_once_across_a_kill(quix_python, raylog_client, kafka_config,
                                                                  tmp_path):
    """processing_guarantee="exactly-once" (Kafka transactions through the
    front door): the app is killed (SIGKILL) while it processes 10,000
    messages, then runs again to the end; the output, read read_committed,
    holds each key's counts 1, 2, ... n once each, in order (a count of the
    killed run's open transaction is aborted; its state change with it)."""
    name = uuid.uuid4().hex[:8]
    source, sink, group = f"quix-in-{name}", f"quix-out-{name}", f"quix-{name}"
    raylog_client.create_topic(source, partitions=PARTITIONS)
    config = {"kafka": kafka_config, "input": source, "output": sink, "consumer_group": group,
              "state_dir": str(tmp_path / "state"), "idle_timeout_s": 30.0, "commit_every": 250,
              "processing_guarantee": "exactly-once"}
    expected = produce(kafka_config, source, 0, MESSAGES)

    # the first run, killed once some transactions have committed
    config_path = tmp_path / "first.json"
    config_path.write_text(json.dumps({**config, "count": MESSAGES}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen([quix_python, APP, str(config_path)], stdout=subprocess.PIPE, stderr=log,
                                start_new_session=True, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + RUN_S
        while time.monotonic() < deadline and proc.poll() is None:
            if raylog_client.registry.topic_exists(sink) and sum(raylog_client.end_offsets(sink).values()) > 0:
                if sum(map(len, committed_counts(kafka_config, sink).values())) >= MESSAGES // 5:
                    break
            time.sleep(1)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = sum(map(len, committed_counts(kafka_config, sink).values()))
    assert MESSAGES // 5 <= done < MESSAGES

    processed, log = run_app(quix_python, {**config, "count": MESSAGES - done}, tmp_path, "second")
    counts = committed_counts(kafka_config, sink)
    assert {k: len(v) for k, v in counts.items()} == dict(expected), log[-4000:]
    assert all(v == list(range(1, len(v) + 1)) for v in counts.values()), \
        {k: v[:20] for k, v in counts.items() if v != list(range(1, len(v) + 1))}
