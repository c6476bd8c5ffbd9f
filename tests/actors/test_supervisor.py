"""The supervisor's repair pass, the tombstones a delete leaves, and the
check a returning partition actor makes before it serves: on the shared
ZooKeeper and the session's local Ray, with a cluster of this module's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from raylog.actors.supervisor import remove_log, stop_supervisor
from raylog.errors import LogInUseError

pytestmark = pytest.mark.timeout(300)
RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")


@pytest.fixture(scope="module")
def client(zookeeper, ray_local, tmp_path_factory):
    from raylog.client import Client

    if not zookeeper.running:
        zookeeper.start()
    client = Client(zookeeper=zookeeper.connect_string, cluster=f"sup-{uuid.uuid4().hex[:12]}",
                    data_dir=str(tmp_path_factory.mktemp("sup-data")), data_host="127.0.0.1")
    try:
        yield client
    finally:
        stop_supervisor(client.settings.cluster)
        for topic in client.list_topics():
            client.delete_topic(topic)
        client.close()


def _fill(client, topic: str, partitions: int = 2, n: int = 40) -> list[bytes]:
    import ray

    client.create_topic(topic, partitions=partitions, flush_ms=10)
    values = [b"%s-%d" % (topic.encode(), i) for i in range(n)]
    producer = client.producer(acks=1)
    for value in values:
        producer.send(topic, value)
    producer.close()
    for p in range(partitions):
        ray.get(client.partition_actor(topic, p).flush.remote())
    return values


def _read_all(client, topic: str) -> list[bytes]:
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        ends = client.end_offsets(topic)
        got, deadline = [], time.monotonic() + 60
        while any((consumer.position(topic, p) or 0) < end for p, end in ends.items()):
            assert time.monotonic() < deadline
            got += [m.value for m in consumer.poll(timeout_ms=200)]
        return got
    finally:
        consumer.close()


def _kill_actors(client, topic: str, partitions: int) -> None:
    import ray

    for p in range(partitions):
        ray.kill(client.partition_actor(topic, p), no_restart=True)
    deadline = time.monotonic() + 60
    while any(client._actor(topic, p) is not None for p in range(partitions)):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _segments(log_dir: str) -> list[str]:
    try:
        return [n for n in os.listdir(log_dir) if n.endswith(".log")]
    except FileNotFoundError:
        return []


def test_the_supervisor_serves_again_the_partitions_whose_actors_are_gone(client):
    topic = "gone"
    values = _fill(client, topic)
    client.start_supervisor(interval_s=0.5)
    old = {p: e["epoch"] for p, e in client.registry.endpoints(topic).items()}
    _kill_actors(client, topic, 2)

    deadline = time.monotonic() + 120  # no client call from here on but reads
    while {p: e["epoch"] for p, e in client.registry.endpoints(topic).items()}.keys() != {0, 1} or any(
        client.registry.endpoint(topic, p)["epoch"] <= old[p] for p in (0, 1)
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert sorted(_read_all(client, topic)) == sorted(values)
    assert {r["state"] for r in client.repair(topic)} == {"serving"}
    stop_supervisor(client.settings.cluster)


def test_topics_describe_shows_unserved_partitions_and_topics_repair_serves_them(client, zookeeper):
    topic = "unserved"
    _fill(client, topic, partitions=1, n=5)
    stop_supervisor(client.settings.cluster)  # nobody serves it again behind the test's back
    _kill_actors(client, topic, 1)
    deadline = time.monotonic() + 120  # the dead actor's ZooKeeper session expires
    while client.registry.endpoints(topic):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    import ray

    cli = [RAYLOG, "--zookeeper", zookeeper.connect_string, "--cluster", client.settings.cluster]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
    proc = subprocess.run([*cli, "topics", "describe", topic], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split()[:3] == ["PARTITION", "NODE", "STATE"]
    assert proc.stdout.splitlines()[2].split()[:4] == ["0", "local", "NOT", "SERVED"]
    assert f"raylog topics repair {topic}" in proc.stderr

    address = ray.get_runtime_context().gcs_address
    proc = subprocess.run([*cli, "--ray-address", address, "topics", "repair", topic], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = proc.stdout.splitlines()[1].split()
    # started by this pass, or by the first pass of the supervisor it started
    assert row[:3] == [topic, "0", "local"] and row[3] in ("started", "serving"), proc.stdout
    proc = subprocess.run([*cli, "topics", "describe", topic], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.splitlines()[2].split()[:3] == ["0", "local", "serving"], proc.stdout
    stop_supervisor(client.settings.cluster)


def test_a_returning_actor_empties_the_directory_of_a_deleted_topic(client, monkeypatch):
    """The topic is deleted while its actor is down (so only the tombstone
    remembers it) and created again before anyone removed the old log."""
    import raylog.actors.supervisor as supervisor

    topic = "returning"
    _fill(client, topic, partitions=1, n=10)
    log_dir = client.registry.placement(topic, 0)["log_dir"]
    _kill_actors(client, topic, 1)
    client.registry.delete_topic(topic)  # as a client outside Ray does: a tombstone only
    assert _segments(log_dir) and client.registry.tombstone("local", log_dir) is not None

    monkeypatch.setattr(supervisor, "remove_deleted", lambda *a, **k: [])  # nobody else removes it first
    client.create_topic(topic, partitions=1)
    assert client.end_offsets(topic) == {0: 0}
    assert _read_all(client, topic) == []
    assert client.registry.tombstone("local", log_dir) is None


def test_a_repair_pass_removes_deleted_logs_and_stops_actors_of_deleted_topics(client):
    import ray

    down, running = "deleted-down", "deleted-running"
    _fill(client, down, partitions=1, n=5)
    _fill(client, running, partitions=1, n=5)
    down_dir = client.registry.placement(down, 0)["log_dir"]
    running_dir = client.registry.placement(running, 0)["log_dir"]
    _kill_actors(client, down, 1)
    client.registry.delete_topic(down)
    client.registry.delete_topic(running)  # its actor still serves the old log
    assert client._actor(running, 0) is not None

    from raylog.actors.supervisor import repair

    stop_supervisor(client.settings.cluster)
    rows: dict = {}
    deadline = time.monotonic() + 60
    while True:
        # A killed actor's worker can hold its log's lock a moment after Ray forgot the actor:
        # that removal is "pending" and the next pass (as the supervisor's next) removes it.
        rows.update({r["topic"]: r for r in repair(client.registry, client.settings.zookeeper,
                                                    token=client.settings.token)})
        if rows[down]["state"] != "pending" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rows[down]["state"] == "removed" and rows[running]["state"] == "removed", rows
    assert not os.path.exists(down_dir) and not _segments(running_dir)
    assert client._actor(running, 0) is None
    assert client.registry.tombstones() == {}
    assert ray.is_initialized()


def test_an_actor_that_dies_while_the_pass_stops_it_is_not_a_failure(client, monkeypatch):
    """delete_topic stops the actors too: one found by the pass may be gone
    (killed) by the time the pass asks it; the log is then removed on its node."""
    import ray

    from raylog.actors import supervisor

    topic = "deleted-racing"
    _fill(client, topic, partitions=1, n=5)
    log_dir = client.registry.placement(topic, 0)["log_dir"]
    actor = client.partition_actor(topic, 0)
    client.registry.delete_topic(topic)
    stop_supervisor(client.settings.cluster)
    found = supervisor._running_actor(client.registry.cluster, topic, 0)
    assert found is not None
    from raylog.testing.faults import actor_pid

    pid = actor_pid(actor)
    ray.kill(actor, no_restart=True)  # as delete_topic does, just after the pass found it
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}"):  # its log's lock goes with its process
        assert time.monotonic() < deadline, "the killed actor's process to end"
        time.sleep(0.05)
    monkeypatch.setattr(supervisor, "_running_actor", lambda *_: found)
    rows = supervisor.remove_deleted(client.registry, client.settings.zookeeper, ray.nodes(), topic=topic,
                                     token=client.settings.token)
    assert [r["state"] for r in rows] == ["removed"], rows
    assert not _segments(log_dir)


def test_removing_a_log_that_its_owner_holds_is_refused_and_keeps_it(tmp_path):
    from raylog.config import TopicConfig
    from raylog.storage.log import PartitionLog
    from raylog.storage.message import encode_message_set

    log = PartitionLog(str(tmp_path / "p"), TopicConfig())
    try:
        log.append(encode_message_set([b"kept"]))
        log.flush()
        with pytest.raises(LogInUseError, match="still open by its owner") as info:
            remove_log(str(tmp_path / "p"), remove_directory=True)
        assert info.value.retriable
        assert log.high_watermark > 0 and _segments(str(tmp_path / "p"))
    finally:
        log.close()
    assert remove_log(str(tmp_path / "p"), remove_directory=True)
    assert not os.path.exists(tmp_path / "p")
    assert remove_log(str(tmp_path / "p"), remove_directory=True) is False
