"""A leader whose process dies (SIGKILL: its data port refuses connections,
its ZooKeeper session lingers until it times out) is replaced by an in-sync
follower at once, not after the session timeout and ``replica_lag_ms``: the
follower's connection to it fails, a new connect is refused, the follower
removes the dead session's nodes and takes over by compare-and-set (leader
epoch + 1). A plain producer with ``acks="all"`` (the default retry policy,
no resend loop of its own) rides through: nothing acknowledged is lost,
nothing is stored twice. The killed replica, restarted by Ray, finds another
replica leading and follows it, and the ISR is whole again.

The cluster (three disk nodes on one machine) runs in a child process of its
own (the ``run_cluster_script`` fixture).
"""

from __future__ import annotations

import textwrap

SCRIPT = textwrap.dedent(
    """
    import glob, json, os, signal, sys, time
    import ray
    from ray.cluster_utils import Cluster

    from raylog.client import Client
    from raylog.replication.admin import leader_actor
    from raylog.replication.state import read_state
    from raylog.testing.clusters import log_bytes, start_disk_nodes, wait_until

    zookeeper, cluster_name, data_dir = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    out = {}
    try:
        nodes = start_disk_nodes(cluster, ("disk-a", "disk-b", "disk-c"))
        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        # the default replica_lag_ms (10 s) and a 10 s ZooKeeper session: the old way waited for both
        client.create_topic("d", partitions=1, replication_factor=3, min_insync_replicas=2, flush_ms=5)
        producer = client.producer(acks="all")
        acked = [producer.send("d", b"a%d" % i).result() for i in range(100)]
        zk, paths = client._zk, client.registry.paths
        out["whole_before"] = wait_until(lambda: len(read_state(zk, paths, "d", 0)[0].isr) == 3, 60)
        state, actor = leader_actor(zk, client.registry, cluster_name, "d", 0)
        pid = ray.get(actor.pid.remote(), timeout=60)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        futures = [producer.send("d", b"b%d" % i) for i in range(100)]
        errors = []
        for f in futures:
            try:
                acked.append(f.result())
            except Exception as err:
                errors.append(f"{type(err).__name__}: {err}"[:300])
        out["errors"] = errors[:3]
        out["acked"] = len(acked)
        out["first_batch_acked_s"] = round(time.monotonic() - killed, 3)  # reported, not asserted
        after = read_state(zk, paths, "d", 0)[0]
        out["leaders"] = [state.leader, after.leader, state.leader_epoch, after.leader_epoch]
        out["whole_after"] = wait_until(lambda: len(read_state(zk, paths, "d", 0)[0].isr) == 3, 120)
        final = read_state(zk, paths, "d", 0)[0]
        out["final"] = [final.leader, final.leader_epoch, list(final.isr)]
        consumer = client.consumer(["d"], group="g", auto_offset_reset="earliest")
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 200 and time.monotonic() < deadline:
            seen += [m.value for m in consumer.poll(timeout_ms=500)]
        seen += [m.value for m in consumer.poll(timeout_ms=1000)]
        out["seen_exactly"] = seen == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]
        out["seen"] = len(seen)
        leader_dir = client.registry.placement("d", 0)["log_dir"]
        every = [leader_dir] + sorted(glob.glob(leader_dir + "@*"))
        out["identical"] = wait_until(lambda: len({log_bytes(d) for d in every}) == 1, 60)
        producer.close()
        consumer.close()
        client.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


def test_a_leader_whose_process_dies_is_replaced_by_a_follower_and_a_plain_producer_loses_nothing(
    run_cluster_script,
):
    out = run_cluster_script(SCRIPT)
    assert out["whole_before"]
    assert out["errors"] == [] and out["acked"] == 200, out
    old, new, old_epoch, new_epoch = out["leaders"]
    # a follower took over (the killed process did not get to lead again after its restart)
    assert new != old and new_epoch == old_epoch + 1, out
    # the killed replica came back as a follower and caught up
    assert out["whole_after"], out["final"]
    assert out["final"][0] == new and out["final"][1] == new_epoch
    assert out["seen_exactly"], out["seen"]  # nothing lost, nothing twice, in order
    assert out["identical"]
