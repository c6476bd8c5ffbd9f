"""Run as a script by test_replicated_compaction.py (a Ray cluster of its own
needs a process of its own): a ``ray.cluster_utils.Cluster`` with four disk
nodes, a compacted topic of one partition over three replicas whose cleaners
run soon (small segments, a short ``retention_check_ms``, any dirty ratio).
Prints one JSON line per phase with what each replica serves (read over the
data channel from each replica's own endpoint, up to the committed offset it
knows: the latest record of each key and whether every record sits at the
offset it was acknowledged at) and the model of the acknowledged writes; the
test judges them.

1. ``cleaned``: writes (acks="all") and deletes (tombstones); once every
   replica's directory holds a cleaned segment (each cleaned on its own).
2. ``new_follower``: the partition reassigned to the spare node in place of
   a follower: the new replica catches up from the cleaned leader.
3. ``leader_change``: more writes while the leader's process is killed
   (SIGKILL) as its cleaner runs; a follower takes over, the old leader comes
   back as a follower; nothing acknowledged is lost on any replica.

    python compacted_replicas.py <zookeeper connect string> <data dir>
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid

WAIT_S = 240.0
KEYS = 30


def replica_records(client, topic: str) -> dict[str, list]:
    """``{node: [(offset, key, value)]}``: what each running replica serves from the log start."""
    from raylog.storage.record_batch import decode_batch, iter_batches, next_offset_after
    from raylog.transfer.connection import BrokerConnection
    from raylog.zk.partition_state import running_replicas

    out = {}
    for node, endpoint in running_replicas(client.registry.zk, client.registry.paths, topic, 0).items():
        records = []
        with BrokerConnection(endpoint["host"], endpoint["port"], token=client.settings.token,
                              timeout_s=30.0) as conn:
            offset = 0
            while True:
                reply = conn.fetch(topic, 0, offset, 1 << 16)
                data = bytes(reply.data)
                whole = 0
                for pos, header in iter_batches(data):
                    if pos + header.size > len(data):
                        break
                    whole = pos + header.size
                    if not header.control:
                        records += [(r.offset, r.key, r.value) for r in decode_batch(data, pos).records
                                    if r.offset >= offset]
                if not whole:
                    break
                offset = next_offset_after(data, whole)
        out[node] = records
    return out


def latest(records) -> dict:
    table = {}
    for offset, key, value in records:
        table[key] = (offset, value)
    return table


def replica_dirs(client, topic: str) -> dict[str, str]:
    from raylog.storage.fileops import replica_log_dir

    state = client.replication_state(topic, 0)
    place = client.registry.placement(topic, 0)
    return {node: replica_log_dir(place["log_dir"], node, state.origin) for node in state.replicas}


def cleaned(directory: str) -> bool:
    try:
        return any(name.endswith(".index") for name in os.listdir(directory))
    except FileNotFoundError:
        return False


def wait(check, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def show(value):
    return None if value is None else value.decode()


def report(phase: str, client, topic: str, acked: dict, stored: dict, sent: set, extra=None) -> None:
    """Print what each replica serves once every running replica serves
    every acknowledged write (up to the committed offset it knows)."""
    last = max(acked.values())[0] if acked else 0

    def caught_up():
        got = replica_records(client, topic)
        if len(got) == 3 and all(any(o >= last for o, _k, _v in rs) for rs in got.values()):
            return got
        return None

    got = wait(caught_up, f"every replica serving offset {last} ({phase})")
    rows = {}
    for node, records in got.items():
        table = latest(records)
        rows[node] = {
            "records": len(records),
            # every record a replica serves is one sent, at the offset it was acknowledged at
            "misplaced": [[o, show(k), show(v)] for o, k, v in records
                          if (k, v) not in sent or stored.get(o, (k, v)) != (k, v)][:5],
            "latest": {show(k): [o, show(v)] for k, (o, v) in sorted(table.items())},
        }
    model = {show(k): [o, show(v)] for k, (o, v) in sorted(acked.items())}
    # (a record stored but not acknowledged, its ack lost with a leader, may be a key's latest)
    every = sorted(([show(k), show(v)] for k, v in sent), key=str)
    print(json.dumps({"phase": phase, "replicas": rows, "model": model, "sent": every, **(extra or {})}), flush=True)


def main(zookeeper: str, data_dir: str) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from raylog.client import Client
    from raylog.testing.clusters import start_disk_nodes
    from raylog.testing.faults import kill_actor

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    client = producer = None
    try:
        start_disk_nodes(cluster, ("disk-a", "disk-b", "disk-c", "disk-d"))
        client = Client(zookeeper=zookeeper, cluster=f"cr-{uuid.uuid4().hex[:12]}", data_dir=data_dir,
                        data_host="127.0.0.1")
        topic = "compacted"
        client.create_topic(topic, partitions=1, replication_factor=3, min_insync_replicas=2,
                            cleanup_policy="compact", segment_bytes=8192, max_message_bytes=4096, retention_check_ms=200,
                            min_cleanable_dirty_ratio=0.01, min_compaction_lag_ms=0, delete_retention_ms=10**9,
                            flush_ms=5)
        producer = client.producer(acks="all", linger_ms=1)
        acked: dict[bytes, tuple[int, bytes | None]] = {}  # key -> (offset, value) of its last acknowledged write
        stored: dict[int, tuple] = {}  # offset -> (key, value) acknowledged there
        sent: set = set()  # every (key, value) sent, acknowledged or not

        def write(rounds: int, tag: str, during=None) -> None:
            futures = []
            for r in range(rounds):
                for k in range(KEYS):
                    key = b"key-%d" % k
                    value = None if (r * KEYS + k) % 7 == 3 else b"%s-%d-%d" % (tag.encode(), r, k)
                    sent.add((key, value))
                    futures.append((key, value, producer.send(topic, value, key=key, partition=0)))
                if during is not None and r == rounds // 2:
                    during()
            for key, value, future in futures:
                try:
                    _partition, offset = future.result(timeout_s=WAIT_S)
                except Exception as err:  # noqa: BLE001 - not acknowledged: not in the model
                    print(f"# not acknowledged: {key!r}: {err}", file=sys.stderr)
                    continue
                stored[offset] = (key, value)
                if key not in acked or acked[key][0] < offset:
                    acked[key] = (offset, value)

        # 1. writes and deletes; every replica cleans on its own
        write(20, "a")
        write(2, "roll")  # the latest of the first round leave the active segment
        dirs = replica_dirs(client, topic)
        wait(lambda: all(cleaned(d) for d in dirs.values()), "a cleaned segment on every replica")
        report("cleaned", client, topic, acked, stored, sent, {"dirs_cleaned": {n: cleaned(d) for n, d in dirs.items()}})

        # 2. a new replica catches up from the cleaned leader
        state = client.replication_state(topic, 0)
        spare = next(n for n in ("disk-a", "disk-b", "disk-c", "disk-d") if n not in state.replicas)
        follower = next(n for n in state.replicas if n != state.leader)
        leader_cleaned = cleaned(dirs[state.leader])
        client.reassign_partition(topic, 0, [n for n in state.replicas if n != follower] + [spare], timeout_s=WAIT_S)
        wait(lambda: spare in client.replication_state(topic, 0).isr, "the new replica in the ISR")
        dirs = replica_dirs(client, topic)
        report("new_follower", client, topic, acked, stored, sent,
               {"spare": spare, "leader_cleaned_before": leader_cleaned, "spare_cleaned": cleaned(dirs[spare])})

        # 3. the leader's process killed while it cleans (writes go on); a follower takes over
        old = client.replication_state(topic, 0)
        leader_actor = client.leader_actor(topic, 0)
        killed = {}

        def kill_leader():
            killed["pid"] = kill_actor(leader_actor)

        write(20, "b", during=kill_leader)
        write(2, "roll2")
        wait(lambda: client.replication_state(topic, 0).leader_epoch > old.leader_epoch, "a new leader")
        wait(lambda: len(client.replication_state(topic, 0).isr) == 3, "the old leader back in the ISR")
        new = client.replication_state(topic, 0)
        report("leader_change", client, topic, acked, stored, sent,
               {"old_leader": old.leader, "new_leader": new.leader, "epochs": [old.leader_epoch, new.leader_epoch]})
    finally:
        if producer is not None:
            producer.close()
        if client is not None:
            client.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
