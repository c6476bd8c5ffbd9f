"""What the tests of stream processors against the front door share (the apps
of ``apps/``, each run in a venv of its own as a subprocess): whether the
app's venv can be used, running an app to its end (killed with its children on
a timeout), producing keyed JSON messages and reading the counts an app wrote.

The apps write ``{"count": n}`` under each message's key; their input is
``{"i": i}`` with keys ``key-00`` ... over ``keys`` keys."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter

import confluent_kafka

WAIT_S = 120.0


def venv_unavailable(venv: str, constraints: str, what: str, target: str) -> str | None:
    """Why the app venv ``venv`` cannot be used (``None``: it can): absent, or
    made from another ``constraints`` file than the checkout's (the Makefile's
    stamp, ``.constraints-sha256``, is the sha256 of that file). ``what`` names
    the app, ``target`` the make target that makes the venv."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        return (f"the {what} venv {venv} is absent: `make {target}` makes it "
                f"(needs the package index; `make test` runs it first)")
    with open(constraints, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    try:
        with open(os.path.join(venv, ".constraints-sha256")) as f:
            have = f.read().strip()
    except FileNotFoundError:
        have = None
    if have != want:
        return f"the {what} venv {venv} is not made from {constraints} as it is: run `make {target}`"
    return None


def run_app(python: str, app: str, config: dict, workdir, name: str, timeout: float) -> tuple[dict, str]:
    """Run ``app`` (``python app CONFIG.json``) to its end: ``(the last line of
    its stdout as JSON, its log)``; it is killed (with any process it started)
    when it overruns ``timeout`` seconds or the test stops, and a failed run
    fails with the tail of its log."""
    config_path = os.path.join(workdir, f"{name}.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    log_path = os.path.join(workdir, f"{name}.log")
    with open(log_path, "w") as log:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        proc = subprocess.Popen([python, app, config_path], stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True, cwd=workdir, env=env)
        out, overran = "", False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            overran = True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    with open(log_path) as f:
        text = f.read()
    assert not overran, f"{app} did not finish in {timeout:.0f} s (killed); its log ends:\n{text[-4000:]}"
    assert proc.returncode == 0, f"{app} exited with {proc.returncode}:\n{text[-4000:]}"
    lines = out.strip().splitlines()
    assert lines, f"{app} printed nothing; its log ends:\n{text[-4000:]}"
    return json.loads(lines[-1]), text


def produce(config: dict, topic: str, start: int, n: int, keys: int) -> Counter:
    """``n`` JSON messages over ``keys`` keys (librdkafka's settings
    ``config``); their number per key."""
    producer = confluent_kafka.Producer({**config, "acks": "all", "linger.ms": 5})
    errors = []
    per_key = Counter()
    for i in range(start, start + n):
        key = f"key-{i % keys:02d}"
        producer.produce(topic, json.dumps({"i": i}).encode(), key=key.encode(),
                         on_delivery=lambda err, msg: err is not None and errors.append(err))
        per_key[key] += 1
        producer.poll(0)
    assert producer.flush(WAIT_S) == 0 and not errors, errors
    return per_key


def output_counts(config: dict, topic: str, isolation: str = "read_uncommitted") -> dict[str, list[int]]:
    """Every count of each key on the output topic, in order, read to its end at ``isolation``."""
    consumer = confluent_kafka.Consumer({**config, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                         "isolation.level": isolation})
    counts: dict[str, list[int]] = {}
    try:
        metadata = consumer.list_topics(topic, timeout=WAIT_S).topics[topic]
        tps = [confluent_kafka.TopicPartition(topic, p) for p in metadata.partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=WAIT_S)[1] for tp in tps}
        consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in ends])
        left = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + WAIT_S
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                assert msg.error() is None, msg.error()
                counts.setdefault(msg.key().decode(), []).append(json.loads(msg.value())["count"])
            for tp in consumer.position([confluent_kafka.TopicPartition(topic, p) for p in left]):
                if tp.offset >= ends[tp.partition]:
                    left.discard(tp.partition)
        assert not left, f"the output topic was not read to its end: partitions {sorted(left)}"
    finally:
        consumer.close()
    return counts


def last_counts(config: dict, topic: str) -> tuple[dict[str, int], int]:
    """The last count of each key on the output topic, and how many records it has."""
    counts = output_counts(config, topic)
    return {key: values[-1] for key, values in counts.items()}, sum(map(len, counts.values()))
