"""Run as a script by test_replicated_delete_records.py (a Ray cluster of
its own needs a process of its own): a ``ray.cluster_utils.Cluster`` with
two disk nodes, a topic of one partition over two replicas;
``client.delete_records`` at the leader, then the leader's process killed
so that the follower leads. Prints one JSON line per phase with each
replica's ``log-start-offset`` file and what the partition answers; the
test judges them.

1. ``deleted``: records written (acks="all"), the records before an offset
   in the middle deleted: the answer, the leader's offsets, each replica's
   recorded start once the follower took it.
2. ``follower_leads``: the leader's process killed (SIGKILL); once the
   other replica leads (leader epoch + 1): its offsets and what a consumer
   from earliest reads.

    python delete_records_replicas.py <zookeeper connect string> <data dir>
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compacted_replicas import replica_dirs, wait  # noqa: E402 - the helpers of the compaction script

WAIT_S = 240.0
#: how long the follower is given to take the leader's start (it fetches at once: well within)
FOLLOW_S = 60.0


def recorded_starts(client, topic: str) -> dict:
    from raylog.storage import log_start

    return {node: log_start.read(directory) for node, directory in replica_dirs(client, topic).items()}


def main(zookeeper: str, data_dir: str) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from raylog.client import Client
    from raylog.testing.clusters import start_disk_nodes
    from raylog.testing.faults import kill_actor

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    client = None
    try:
        start_disk_nodes(cluster, ("disk-a", "disk-b"))
        client = Client(zookeeper=zookeeper, cluster=f"dr-{uuid.uuid4().hex[:12]}", data_dir=data_dir,
                        data_host="127.0.0.1")
        topic = "deleted"
        client.create_topic(topic, partitions=1, replication_factor=2, min_insync_replicas=2, segment_bytes=4096,
                            max_message_bytes=2048,
                            flush_ms=5)
        producer = client.producer(acks="all", linger_ms=1)
        futures = [producer.send(topic, b"v-%03d" % i + b"." * 100, partition=0) for i in range(100)]
        offsets = [f.result(timeout_s=WAIT_S).offset for f in futures]
        producer.close()
        wait(lambda: len(client.replication_state(topic, 0).isr) == 2, "both replicas in the ISR")
        answer = client.delete_records(topic, {0: offsets[60]})
        deadline = time.monotonic() + FOLLOW_S  # (not an abort: the test judges what was recorded)
        while set(recorded_starts(client, topic).values()) != {offsets[60]} and time.monotonic() < deadline:
            time.sleep(0.5)
        old = client.replication_state(topic, 0)
        print(json.dumps({"phase": "deleted", "asked": offsets[60], "answer": answer[0],
                          "offsets": list(client.offsets(topic, 0)), "recorded": recorded_starts(client, topic),
                          "leader": old.leader}), flush=True)

        kill_actor(client.leader_actor(topic, 0))
        wait(lambda: client.replication_state(topic, 0).leader_epoch > old.leader_epoch, "a new leader")
        new = client.replication_state(topic, 0)

        def served():
            try:
                return client.offsets(topic, 0)
            except Exception:  # noqa: BLE001 - the new leader registering
                return None

        deadline = time.monotonic() + WAIT_S
        while (found := served()) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        consumer = client.consumer(topic, auto_offset_reset="earliest")
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 40 and time.monotonic() < deadline:
            got += consumer.poll(500)
        consumer.close()
        print(json.dumps({"phase": "follower_leads", "old_leader": old.leader, "new_leader": new.leader,
                          "offsets": list(found) if found else None,
                          "read": [[m.offset, m.value[:5].decode()] for m in got]}), flush=True)
    finally:
        if client is not None:
            client.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
