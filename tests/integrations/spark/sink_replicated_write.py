"""Run as a script by test_sink_replicated.py (a Ray cluster of its own needs
a process of its own; the tests' shared local Ray has one disk node): a
``ray.cluster_utils.Cluster`` with three disk nodes, a topic of replication
factor 3 (min_insync_replicas 2) and a RayDP Spark session of two executors
retrying failed tasks (``spark.task.maxFailures`` 4). A batch write of
``ROWS`` rows with unique keys, in four Spark tasks (acks=all, the sink's
default; batches of ``BATCH_BYTES``), runs through a Python UDF that sleeps
a little every ``SLOW_EVERY`` rows, so that it lasts long enough for what
happens to it meanwhile:

1. once the log holds a fifth of the write, one of RayDP's executor actors
   is killed (``ray.kill``): Spark runs its task again on the other
   executor once that one is free (RayDP starts no new executor), the same
   rows under the same producer id and sequences;
2. once the log holds a twentieth more (the other executor's task still
   running, the killed task not yet retried), the lead of partition 0
   moves by a failover that cuts off a batch only the leader holds (its
   followers frozen until it holds one, then the leader's partition actor
   SIGKILLed, the followers resumed), and the lead of partition 1 by a
   handoff (on purpose, to another in-sync replica). So the retried task
   sends the batches its first attempt stored to the new leaders, which
   know them from the replicated batches' own producer fields.

Then (3.) a second write, of ``SHORT_ISR_ROWS`` rows on the executor left,
to a topic of replica_lag_ms ``SHORT_LAG_MS``, while partition 0's ISR is
its leader alone for a while (its followers frozen, then resumed): the
leader refuses acks=all batches meanwhile, and the sink waits for the ISR.

Prints one JSON line: whether the write returned, what was done when (the
log's size at each step, Spark's task counts), the leaders before and
after, and the keys read back from the partitions' leaders (every key once,
or the ones missing and doubled); under ``short_isr`` the same of the
second write; the test judges it.

    python sink_replicated_write.py <zookeeper connect string> <data dir> [rows]
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.stored, under spark_helpers

WAIT_S = 120.0
ROWS = 200_000
SPARK_PARTITIONS = 4
TOPIC_PARTITIONS = 2
#: the UDF sleeps SLOW_S every SLOW_EVERY rows of a task
SLOW_EVERY = 500
SLOW_S = 0.05
#: bytes a row takes in the log, about (a record of a 7-character key and a 20-character value in a batch)
ROW_BYTES = 36
#: the sink's batches (kafka.batch.size): about 1,600 rows, a batch every second or so per partition
BATCH_BYTES = 128 * 1024
JOB_GROUP = "raylog-sink-rf3"
#: the followers of partition 0 are frozen until their leader holds a batch they do not (at most
#: FROZEN_MAX_S), then FROZEN_S more, before it is killed (all of it below the topic's replica_lag_ms)
FROZEN_MAX_S = 5.0
FROZEN_S = 0.2
#: the second write (one executor left): its rows, the topic's replica_lag_ms, how long its ISR stays short
SHORT_ISR_ROWS = 40_000
SHORT_LAG_MS = 2_000
SHORT_ISR_S = 2.0
SHORT_ISR_GROUP = "raylog-sink-short-isr"


def _slow_values():
    """A Python UDF passing values through, sleeping every SLOW_EVERY rows."""
    from pyspark.sql import functions as F

    def passthrough(value: str) -> str:
        if int(value[1:7]) % SLOW_EVERY == 0:
            time.sleep(SLOW_S)
        return value

    return F.udf(passthrough, "string")


def _log_bytes(client, topic: str) -> int:
    """The bytes below the high watermarks of ``topic``'s partitions (0 while a lead moves)."""
    total = 0
    for p in range(TOPIC_PARTITIONS):
        try:
            total += client.offsets(topic, p)[1]
        except Exception:  # noqa: BLE001 - a partition between leaders: counted once it serves again
            pass
    return total


def _wait_bytes(client, topic: str, at_least: int, write_done: threading.Event) -> int:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not write_done.is_set():
        seen = _log_bytes(client, topic)
        if seen >= at_least:
            return seen
        time.sleep(0.05)
    return -1


def _executors() -> list[str]:
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith("raydp-executor"))


def _tasks(spark, group: str = JOB_GROUP) -> dict:
    """Tasks of the stages of job group ``group`` (Spark's status tracker): done, running, failed."""
    tracker = spark.sparkContext.statusTracker()
    out = {"completed": 0, "active": 0, "failed": 0}
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else ():
            found = tracker.getStageInfo(stage)
            if found:
                out["completed"] += found.numCompletedTasks
                out["active"] += found.numActiveTasks
                out["failed"] += found.numFailedTasks
    return out


def _kill_executor(events: dict) -> None:
    import ray

    names = _executors()
    events["executors_before"] = names
    namespaces = {a["name"]: a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)}
    victim = names[0]
    ray.kill(ray.get_actor(victim, namespace=namespaces[victim]), no_restart=True)
    events["executor_killed"] = victim


def _state(client, topic: str, partition: int) -> dict:
    state = client.replication_state(topic, partition)
    return {"leader": state.leader, "epoch": state.leader_epoch, "isr": sorted(state.isr)}


def _in_sync(client, topic: str, partition: int, size: int = 3) -> bool:
    from raylog.testing.clusters import wait_until

    def whole():
        state = client.replication_state(topic, partition)
        return (state is not None and len(state.isr) == size and state.leader is not None
                and client.registry.endpoint(topic, partition) is not None)

    return wait_until(whole, WAIT_S)


def _leader_status(leader) -> dict:
    """A replicated partition's leader's log end and high watermark (``committed``: the ISR's)."""
    import ray

    return ray.get(leader.replica_status.remote(), timeout=FROZEN_MAX_S)


def _fail_over_with_followers_behind(client, topic: str, events: dict) -> None:
    """Move the lead of partition 0 by a failover that loses what only its
    leader holds: right after the leader answers a batch (its high
    watermark moves), both followers frozen (SIGSTOP, for less than
    replica_lag_ms, so that they stay in the ISR; the fetch each has
    waiting at the leader ends empty after FETCH_WAIT_MS, before the
    sink's next batch is full), the write going on until the leader holds
    the sink's next batch beyond its high watermark (appended, but with
    acks=all not answered: the high watermark waits for the followers),
    the leader SIGKILLed, the followers resumed: one of them takes over
    without that batch (the old leader, back as a follower, truncates it),
    which a sink that took it as written would lose."""
    import ray

    from raylog.config import NAMESPACE, actor_name
    from raylog.testing.faults import actor_pid, kill_actor, resume_process, stop_process

    state = client.replication_state(topic, 0)
    plain = actor_name(client.settings.cluster, topic, 0)
    followers = [actor_pid(ray.get_actor(f"{plain}@{node}", namespace=NAMESPACE))
                 for node in state.replicas if node != state.leader]
    leader = client.leader_actor(topic, 0)
    deadline = time.monotonic() + FROZEN_MAX_S
    committed = _leader_status(leader)["committed"]
    while time.monotonic() < deadline and _leader_status(leader)["committed"] == committed:
        time.sleep(0.005)
    frozen = []
    try:
        for pid in followers:
            stop_process(pid)
            frozen.append(pid)
        deadline = time.monotonic() + FROZEN_MAX_S
        while time.monotonic() < deadline:
            status = _leader_status(leader)
            if status["log_end_offset"] > status["committed"]:
                break
            time.sleep(0.02)
        time.sleep(FROZEN_S)
        status = _leader_status(leader)
        events["leader_only_bytes"] = status["log_end_offset"] - status["committed"]
        kill_actor(leader)
    finally:
        for pid in frozen:
            resume_process(pid)
    events["failover_at"] = time.monotonic()


def _move_leaders(client, topic: str, events: dict) -> None:
    events["leaders_before"] = [_state(client, topic, p) for p in range(TOPIC_PARTITIONS)]
    _fail_over_with_followers_behind(client, topic, events)
    state = client.replication_state(topic, 1)
    target = next(n for n in state.isr if n != state.leader)
    events["handoff"] = client.hand_off(topic, 1, target, timeout_s=30)  # on purpose
    events["handoff_at"] = time.monotonic()


def _disturb(spark, client, topic: str, expected_bytes: int, write_done: threading.Event, events: dict) -> None:
    try:
        events["executor_kill_bytes"] = _wait_bytes(client, topic, expected_bytes // 5, write_done)
        if events["executor_kill_bytes"] < 0:
            return
        events["tasks_at_executor_kill"] = _tasks(spark)
        _kill_executor(events)
        events["executor_killed_at"] = time.monotonic()
        more = events["executor_kill_bytes"] + expected_bytes // 20
        events["leader_move_bytes"] = _wait_bytes(client, topic, more, write_done)
        if events["leader_move_bytes"] < 0:
            return
        events["tasks_at_leader_move"] = _tasks(spark)
        events["executors_at_leader_move"] = _executors()
        _move_leaders(client, topic, events)
        events["moved_before_the_write_returned"] = not write_done.is_set()
    except Exception:  # noqa: BLE001 - reported to the test
        events["disturb_error"] = traceback.format_exc()[-3000:]


def _frozen_followers(client, topic: str) -> list[int]:
    """The pids of the partition actors of partition 0's followers."""
    import ray

    from raylog.config import NAMESPACE, actor_name
    from raylog.testing.faults import actor_pid

    state = client.replication_state(topic, 0)
    plain = actor_name(client.settings.cluster, topic, 0)
    return [actor_pid(ray.get_actor(f"{plain}@{node}", namespace=NAMESPACE))
            for node in state.replicas if node != state.leader]


def _shrink_isr(client, topic: str, expected_bytes: int, write_done: threading.Event, events: dict) -> None:
    """Once the log holds a quarter of the write: partition 0's followers
    frozen until its ISR is its leader alone (after the topic's
    replica_lag_ms) and SHORT_ISR_S more, then resumed (they catch up and
    are taken back into the ISR)."""
    from raylog.testing.clusters import wait_until
    from raylog.testing.faults import resume_process, stop_process

    try:
        events["freeze_bytes"] = _wait_bytes(client, topic, expected_bytes // 4, write_done)
        if events["freeze_bytes"] < 0:
            return
        leader = client.replication_state(topic, 0).leader
        frozen = []
        try:
            for pid in _frozen_followers(client, topic):
                stop_process(pid)
                frozen.append(pid)
            events["isr_shrank"] = wait_until(lambda: list(client.replication_state(topic, 0).isr) == [leader], WAIT_S)
            time.sleep(SHORT_ISR_S)
            events["isr_while_frozen"] = sorted(client.replication_state(topic, 0).isr)
        finally:
            for pid in frozen:
                resume_process(pid)
        events["resumed_before_the_write_returned"] = not write_done.is_set()
        events["isr_back"] = _in_sync(client, topic, 0)
    except Exception:  # noqa: BLE001 - reported to the test
        events["disturb_error"] = traceback.format_exc()[-3000:]


def _short_isr_write(spark, client, rows: int) -> dict:
    """A write of ``rows`` rows to a topic of replication factor 3
    (min_insync_replicas 2, replica_lag_ms SHORT_LAG_MS) while partition 0's
    ISR is its leader alone for a while (:func:`_shrink_isr`): the leader
    refuses the sink's acks=all batches (NotEnoughReplicasError, before
    appending) until its followers are back; the sink sends them again
    rather than fail its task."""
    topic = f"isr-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=TOPIC_PARTITIONS, replication_factor=3, min_insync_replicas=2,
                        replica_lag_ms=SHORT_LAG_MS)
    found: dict = {"rows": rows, "in_sync": all(_in_sync(client, topic, p) for p in range(TOPIC_PARTITIONS))}
    df = spark.range(0, rows, 1, 2).selectExpr(
        "format_string('k%06d', id) AS key", "format_string('v%06d-%s', id, repeat('x', 12)) AS value")
    df = df.select("key", _slow_values()("value").alias("value"))
    write_done = threading.Event()
    events: dict = {}
    spark.sparkContext.setJobGroup(SHORT_ISR_GROUP, "the write while an ISR is short")
    disturber = threading.Thread(target=_shrink_isr, args=(client, topic, rows * ROW_BYTES, write_done, events))
    disturber.start()
    try:
        df.write.format("raylog").option("topic", topic).option("kafka.batch.size", BATCH_BYTES).mode("append").save()
        found["write"] = "returned"
    except Exception as err:  # noqa: BLE001 - reported to the test
        found["write"] = f"failed: {err}"[:3000]
    write_done.set()
    disturber.join()
    found["events"] = events
    found["tasks"] = _tasks(spark, SHORT_ISR_GROUP)
    counts = collections.Counter(_keys(client, topic))
    found["stored"] = sum(counts.values())
    found["missing_count"] = len({f"k{i:06d}" for i in range(rows)} - set(counts))
    found["doubled_count"] = sum(n - 1 for n in counts.values() if n > 1)
    return found


def _keys(client, topic: str) -> list[str]:
    """Every key stored in ``topic``, read from the partitions' leaders' data sockets."""
    import spark_helpers

    return [k.decode() for _p, _o, k, _v, _t in spark_helpers.log_messages(client, topic)]


def main(zookeeper: str, data_dir: str, rows: int = ROWS) -> None:
    import ray
    from ray.cluster_utils import Cluster

    import raylog_spark
    from raylog.client import Client
    from raylog.testing.clusters import start_disk_nodes

    # a head of 3 CPUs: RayDP's two executors (one core each) and one more
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    client = None
    spark = None
    found: dict = {"rows": rows}
    try:
        start_disk_nodes(cluster, ("disk-a", "disk-b", "disk-c"))
        client = Client(zookeeper=zookeeper, cluster=f"sr-{uuid.uuid4().hex[:12]}", data_dir=data_dir,
                        data_host="127.0.0.1")
        topic = f"rf3-{uuid.uuid4().hex[:8]}"
        client.create_topic(topic, partitions=TOPIC_PARTITIONS, replication_factor=3, min_insync_replicas=2)
        found["in_sync"] = all(_in_sync(client, topic, p) for p in range(TOPIC_PARTITIONS))
        spark = raylog_spark.init_spark(app_name="raylog-sink-rf3", num_executors=2, executor_cores=1,
                                        executor_memory="512M", configs={"spark.task.maxFailures": "4"})
        assert raylog_spark.use_cluster(spark, client)
        found["executors"] = _executors()

        df = spark.range(0, rows, 1, SPARK_PARTITIONS).selectExpr(
            "format_string('k%06d', id) AS key", "format_string('v%06d-%s', id, repeat('x', 12)) AS value")
        df = df.select("key", _slow_values()("value").alias("value"))
        write_done = threading.Event()
        events: dict = {}
        spark.sparkContext.setJobGroup(JOB_GROUP, "the write")
        disturber = threading.Thread(target=_disturb,
                                     args=(spark, client, topic, rows * ROW_BYTES, write_done, events))
        started = time.monotonic()
        disturber.start()
        try:
            writer = df.write.format("raylog").option("topic", topic).option("kafka.batch.size", BATCH_BYTES)
            writer.mode("append").save()
            found["write"] = "returned"
        except Exception as err:  # noqa: BLE001 - reported to the test
            found["write"] = f"failed: {err}"[:3000]
        write_done.set()
        found["write_s"] = round(time.monotonic() - started, 1)
        disturber.join()
        found["tasks"] = _tasks(spark)
        found["executors_after"] = _executors()
        for name in ("executor_killed_at", "failover_at", "handoff_at"):
            if name in events:
                events[name] = round(events[name] - started, 1)
        found["events"] = events
        found["write_bytes"] = _log_bytes(client, topic)
        found["leaders_after"] = [_state(client, topic, p) for p in range(TOPIC_PARTITIONS)]
        keys = _keys(client, topic)
        counts = collections.Counter(keys)
        expected = {f"k{i:06d}" for i in range(rows)}
        found["stored"] = len(keys)
        found["distinct"] = len(counts)
        found["missing"] = sorted(expected - set(counts))[:20]
        found["missing_count"] = len(expected - set(counts))
        found["doubled"] = sorted(k for k, n in counts.items() if n > 1)[:20]
        found["doubled_count"] = sum(n - 1 for n in counts.values() if n > 1)
        found["unexpected"] = sorted(set(counts) - expected)[:20]
        found["short_isr"] = _short_isr_write(spark, client, SHORT_ISR_ROWS)
        print(json.dumps(found), flush=True)
    finally:
        if spark is not None:
            raylog_spark.stop_spark()
        if client is not None:
            client.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))
