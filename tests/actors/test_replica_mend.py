"""A replica whose stored bytes were damaged mends them from an in-sync
replica when it restarts: real multi-node Ray cluster (two disk nodes),
real ZooKeeper, a byte flipped in a follower's flushed segment, the
follower's process killed; recovery finds and keeps the damage, the
restarted follower fetches the range from the leader and writes it back:
the two logs are byte-identical again.

The cluster runs in a child process of its own (the ``run_cluster_script`` fixture).
"""

from __future__ import annotations

import textwrap

MEND = textwrap.dedent(
    """
    import json, sys, time
    import ray
    from ray.cluster_utils import Cluster

    from raylog.actors.partition import actor_name
    from raylog.client import Client
    from raylog.config import NAMESPACE
    from raylog.testing.clusters import log_bytes, start_disk_nodes, wait_until
    from raylog.testing.faults import flip_byte, kill_actor

    zookeeper, cluster_name, data_dir = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    out = {}
    try:
        start_disk_nodes(cluster, ("disk-a", "disk-b"))
        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        client.create_topic("m", partitions=1, replication_factor=2, min_insync_replicas=2, flush_ms=5)
        producer = client.producer(acks="all")
        acked = [producer.send("m", b"value-%03d" % i).result(60) for i in range(60)]
        producer.close()
        row = client.describe_topic("m")["partitions"][0]
        leader = row["leader"]
        follower = [n for n in row["replicas"] if n != leader][0]
        leader_dir = client.registry.placement("m", 0)["log_dir"]
        follower_dir = leader_dir + "@" + follower
        out["caught_up"] = wait_until(lambda: log_bytes(follower_dir) == log_bytes(leader_dir)
                                      and len(log_bytes(leader_dir)) == client.offsets("m", 0)[1], 60)
        bad = acked[20][1]
        flip_byte(follower_dir, bad)
        out["damaged"] = log_bytes(follower_dir) != log_bytes(leader_dir)
        actor = ray.get_actor(actor_name(cluster_name, "m", 0) + "@" + follower, namespace=NAMESPACE)
        old_pid = kill_actor(actor)
        out["mended"] = wait_until(lambda: log_bytes(follower_dir) == log_bytes(leader_dir), 120)
        def stats():
            try:
                return ray.get(actor.stats.remote(), timeout=30)
            except Exception:
                return None
        assert wait_until(lambda: stats() is not None and stats()["pid"] != old_pid and stats()["mended"], 60)
        s = stats()
        out["bad"] = bad
        out["reports"] = [[r["start_offset"], r["end_offset"], r["kept"]] for r in s["recovery_reports"]]
        out["mended_rows"] = s["mended"]
        out["leader"] = leader
        consumer = client.consumer(["m"], group="g", auto_offset_reset="earliest")
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 60 and time.monotonic() < deadline:
            seen += [m.value for m in consumer.poll(timeout_ms=500)]
        out["seen_ok"] = seen == [b"value-%03d" % i for i in range(60)]
        consumer.close()
        client.delete_topic("m")
        client.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


def test_a_damaged_follower_mends_the_range_from_the_leader_on_restart(run_cluster_script):
    out = run_cluster_script(MEND)
    assert out["caught_up"] and out["damaged"]
    assert out["mended"], out  # byte-identical to the leader again
    bad = out["bad"]
    (start, end, kept), = out["reports"]
    assert start == bad and end > bad and kept  # recovery found it and kept what follows
    assert out["mended_rows"] == [{"start": start, "end": end, "from": out["leader"]}]
    assert out["seen_ok"]
