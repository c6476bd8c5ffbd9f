"""A follower more than 32 sets behind on one idempotent producer learns
that producer exactly as its leader holds it, across hosts
(:mod:`raylog.testing.hosts`): the follower's process is frozen while the
producer stores 45 sets on the leader (which remembers the last 32 of
them), then goes on and catches up from the leader on another host.

The producer state is rebuilt from the record batches' own fields
(:mod:`raylog.storage.batch_producers`). Each replica's log directory is
copied on its own host and opened there, as a restarted replica would open
it (its newest producer snapshot, written at a roll from what the replica
held in memory, then the batches after it); the tables agree: the same
producer, epoch and last 32 batches (first and last sequence, offset),
which are the last 32 idempotent batches of that log. On each copy a retry of a remembered batch is answered with the
offset of its first store and appends nothing, and a retry of an older
set, no longer remembered, is refused: never stored twice, whichever
replica leads.

Every wait is bounded by a generous deadline of the test's own; no time is
asserted.
"""

from __future__ import annotations

import json
import uuid

import pytest
import ray

from raylog.config import NAMESPACE, actor_name
from raylog.replication.assignment import replica_log_dir
from raylog.testing.faults import actor_pid, resume_process, stop_process
from raylog.testing.host_checks import log_bytes_on
from raylog.testing.on_hosts import partition_state, read_values, wait

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]

#: on a host: a copy of a replica's directory opened as a log; its producer
#: table, the idempotent batches of the log, and what retries of its sets
#: (given by sequence in argv[2:]) are answered with, the log end before and after
_TABLE = """
import json, os, shutil, sys, tempfile
from raylog.config import TopicConfig
from raylog.errors import DuplicateSequenceError
from raylog.storage.log import PartitionLog
from raylog.storage.record_batch import iter_batches
directory, retried = sys.argv[1], [int(s) for s in sys.argv[2:]]
with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, "replica")
    shutil.copytree(directory, copy)
    plog = PartitionLog(copy, TopicConfig(flush_messages=10**9, flush_ms=10**9))
    try:
        table = {str(pid): {"epoch": s.epoch, "batches": [list(b) for b in s.batches]}
                 for pid, s in plog._batch_producers._producers.items()}
        start, end = plog.log_start_offset, plog.log_end_offset
        data = b""
        while start + len(data) < end:  # a read stops at a segment's end
            chunk = plog.read(start + len(data), end - start - len(data)).tobytes()
            if not chunk:
                break
            data += chunk
        batches = [(start + pos, h, data[pos:pos + h.size]) for pos, h in iter_batches(data) if h.producer_id >= 0]
        by_sequence = {h.base_sequence: raw for _offset, h, raw in batches}
        answers = {}
        for sequence in retried:
            try:
                answers[str(sequence)] = plog.append(by_sequence[sequence])
            except DuplicateSequenceError as err:
                answers[str(sequence)] = type(err).__name__
        snapshots = sorted(int(n.split(".")[0]) for n in os.listdir(copy) if n.endswith(".producers"))
        out = {"table": table, "end": end, "snapshots": snapshots, "end_after_retries": plog.log_end_offset,
               "answers": answers,
               "batches": [[h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence, offset]
                           for offset, h, _raw in batches]}
    finally:
        plog.close()
print(json.dumps(out))
"""


def test_a_follower_far_behind_on_a_producer_learns_it_as_its_leader_holds_it(hosts):
    client = hosts.client(cluster=f"seq-{uuid.uuid4().hex[:8]}")
    topic = f"s-{uuid.uuid4().hex[:8]}"
    # small segments: each replica rolls (and writes its producer snapshot) every dozen sets or so, the
    # follower where its own catching up takes it (it fetches max_message_bytes at a time)
    client.create_topic(topic, partitions=1, replication_factor=2, min_insync_replicas=1, flush_ms=5,
                        segment_bytes=1024, max_message_bytes=512)
    state = partition_state(client, topic)
    follower = next(n for n in state.replicas if n != state.leader)
    place = client.registry.placement(topic, 0)
    leader_host, follower_host = hosts.host(state.leader), hosts.host(follower)
    leader_dir = replica_log_dir(place["log_dir"], state.leader, state.origin)
    follower_dir = replica_log_dir(place["log_dir"], follower, state.origin)
    actor = ray.get_actor(actor_name(client.settings.cluster, topic, 0) + "@" + follower, namespace=NAMESPACE)

    producer = client.producer(acks=1, batch_size=1, linger_ms=0)
    values = [b"value-%03d" % i for i in range(50)]
    for value in values[:5]:  # in step: the follower knows the producer from its first set
        producer.send(topic, value).result(60)
    wait(lambda: log_bytes_on(follower_host, follower_dir) == log_bytes_on(leader_host, leader_dir),
         "the follower holds the first sets")
    pid = actor_pid(actor)
    stop_process(pid)
    try:
        # 45 sets (one message each, sent without waiting): the leader remembers the last 32
        for future in [producer.send(topic, value) for value in values[5:]]:
            future.result(60)
    finally:
        resume_process(pid)
    producer.close()

    def caught_up() -> int | None:
        # the committed end, once the leader's log ends there and the follower holds the same bytes
        # (a follower frozen for less than replica_lag_ms stays in the ISR: the end waits for it)
        end = client.offsets(topic, 0)[1]
        leader = log_bytes_on(leader_host, leader_dir)
        return end if len(leader) == end and log_bytes_on(follower_host, follower_dir) == leader else None

    end = wait(caught_up, "the follower catches up")
    # retries of the newest set, of the oldest one remembered (49 - 31) and of one before it
    retried = ("49", "18", "5")
    on_leader = json.loads(leader_host.python(_TABLE, leader_dir, *retried))
    on_follower = json.loads(follower_host.python(_TABLE, follower_dir, *retried))

    assert on_leader["end"] == end
    ((producer_id, epoch, *_), *_) = on_leader["batches"]
    assert [b[2:4] for b in on_leader["batches"]] == [[s, s] for s in range(50)]  # one batch a set, each once
    remembered = [[first, last, offset] for _pid, _epoch, first, last, offset in on_leader["batches"][-32:]]
    assert on_leader["table"] == {str(producer_id): {"epoch": epoch, "batches": remembered}}
    offset_of = {first: offset for first, _last, offset in remembered}
    assert on_leader["answers"] == {"49": offset_of[49], "18": offset_of[18], "5": "DuplicateSequenceError"}
    assert on_leader["end_after_retries"] == end  # a retry stores nothing again
    # the follower's table is rebuilt from a snapshot of its own, written at one of its rolls after the
    # oldest remembered set: what it held in memory, not only the bytes it was handed, is compared
    assert on_follower["snapshots"] and on_follower["snapshots"][-1] > offset_of[18]
    assert {k: v for k, v in on_follower.items() if k != "snapshots"} == \
        {k: v for k, v in on_leader.items() if k != "snapshots"}
    assert read_values(client, topic, 50) == values
    client.delete_topic(topic)
    client.close()
