"""The raylog sink on a replicated topic survives an executor killed
mid-write and a leader change (issue 48): every row of a write that
returned (so every row acknowledged to Spark) is in the log exactly once.

A topic of replication factor 3 (min_insync_replicas 2) on three disk nodes
of a ``ray.cluster_utils.Cluster``, written by a RayDP Spark session of two
executors retrying failed tasks, acks=all (the sink's default); in a
process of its own (sink_replicated_write.py), as the Ray here must have
three disk nodes. While the write runs, one executor actor is killed
(Spark runs its task again on the other executor: the same producer id and
sequences, so the batches the lost attempt stored are answered as
duplicates and stored once), then, before that retry starts, the lead of
one partition moves by a failover that cuts off a batch only its leader
held (its followers frozen, the leader's partition actor SIGKILLed: the
sink, unanswered, sends the batch again to the new leader) and of the other
by a handoff. The retry's batches then reach new leaders, which know the
producer's sequences from the replicated batches. What the log holds is
read from the partitions' leaders' data sockets, not through the sink.
And a second write, while a partition's ISR is below min_insync_replicas
for a while: its leader refuses acks=all batches (NotEnoughReplicasError)
and the sink sends them again until the ISR is back, losing no task
attempt. Real ZooKeeper, Ray, RayDP Spark and sockets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

SCRIPT = Path(__file__).resolve().parent / "sink_replicated_write.py"


@pytest.fixture(scope="module")
def found(zookeeper, tmp_path_factory):
    if not zookeeper.running:
        zookeeper.start()
    data = tmp_path_factory.mktemp("sink-rf3") / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, str(SCRIPT), zookeeper.connect_string, str(data)],
                          capture_output=True, text=True, timeout=540, env={**env, "RAY_DEDUP_LOGS": "1"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(lines[-1])


def test_every_row_of_a_write_across_an_executor_kill_and_leader_moves_is_stored_once(found):
    events = found["events"]
    assert found["in_sync"] and len(found["executors"]) == 2, found
    assert "disturb_error" not in events, events["disturb_error"]
    # the faults landed while the write ran: an executor (its task failed and ran again) ...
    assert events["executor_kill_bytes"] > 0 and events["executor_killed"] in found["executors"], events
    assert events["tasks_at_executor_kill"]["completed"] == 0, events
    assert found["tasks"]["completed"] == 4, found["tasks"]
    # ... then both leads, before any task ended (so before the killed task's retry began)
    assert events["leader_move_bytes"] > events["executor_kill_bytes"], events
    assert events["moved_before_the_write_returned"], events
    assert events["tasks_at_leader_move"]["completed"] == 0, events
    assert events["leader_only_bytes"] > 0, events  # the failover cut off a batch the sink had sent
    before, after = events["leaders_before"], found["leaders_after"]
    assert after[0]["leader"] != before[0]["leader"] and after[0]["epoch"] > before[0]["epoch"], (before, after)
    assert events["handoff"] and after[1]["epoch"] > before[1]["epoch"], (events["handoff"], before, after)
    # the moves cost no task attempt (the sink sent its unanswered batch again to the new leader itself):
    # the killed executor's task is the only one that failed
    assert found["tasks"]["failed"] == 1, found["tasks"]
    # the write returned: every row was acknowledged, and each is stored once
    assert found["write"] == "returned", found["write"]
    assert found["missing_count"] == 0 and found["doubled_count"] == 0 and not found["unexpected"], \
        {k: found[k] for k in ("missing_count", "missing", "doubled_count", "doubled", "unexpected")}
    assert found["stored"] == found["distinct"] == found["rows"]


def test_a_write_while_the_isr_is_short_waits_for_it_instead_of_failing_tasks(found):
    # a second write (on the executor left): partition 0's followers frozen until its ISR is its
    # leader alone, below min_insync_replicas 2, then resumed; the leader refuses acks=all batches
    # meanwhile (NotEnoughReplicasError) and the sink sends them again until the ISR is back
    case = found["short_isr"]
    events = case["events"]
    assert case["in_sync"] and "disturb_error" not in events, case
    assert events["isr_shrank"] and len(events["isr_while_frozen"]) == 1, events
    assert events["resumed_before_the_write_returned"] and events["isr_back"], events
    assert case["write"] == "returned", case["write"]
    assert case["tasks"] == {"completed": 2, "active": 0, "failed": 0}, case["tasks"]  # no task attempt lost
    assert case["missing_count"] == 0 and case["doubled_count"] == 0 and case["stored"] == case["rows"], case
