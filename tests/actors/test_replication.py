"""Replication on a real multi-node Ray cluster (three disk nodes) and a
real ZooKeeper: replicas on distinct nodes, followers with byte-identical
logs, ``acks="all"`` through the ISR, and ``NotEnoughReplicasError`` below
``min_insync_replicas`` with the data already accepted intact.

The cluster runs in a child process of its own, as in test_multinode.py.
"""

from __future__ import annotations

import textwrap

SCRIPT = textwrap.dedent(
    """
    import glob, json, os, sys, time
    import ray
    from ray.cluster_utils import Cluster

    from raylog.client import Client
    from raylog.errors import ConfigError, NotEnoughReplicasError
    from raylog.retry import RetryPolicy

    zookeeper, cluster_name, data_dir = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    out = {}

    def log_bytes(directory):
        return b"".join(open(f, "rb").read() for f in sorted(glob.glob(os.path.join(directory, "*.log"))))

    def wait_until(check, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return True
            time.sleep(0.2)
        return False

    try:
        nodes = {}
        for name in ("disk-a", "disk-b", "disk-c"):
            nodes[name] = cluster.add_node(num_cpus=1, resources={"raylog_disk": 1}, labels={"raylog-node": name})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        try:
            client.create_topic("toomany", replication_factor=4)
        except ConfigError as err:
            out["too_few_nodes"] = [type(err).__name__, str(err), err.retriable]
        out["toomany_exists"] = "toomany" in client.list_topics()

        client.create_topic("r", partitions=1, replication_factor=3, min_insync_replicas=2, replica_lag_ms=1500,
                            flush_ms=5)
        producer = client.producer(acks="all")
        acked = [producer.send("r", b"v%d" % i).result(60) for i in range(200)]
        out["acked"] = len(acked)
        row = client.describe_topic("r")["partitions"][0]
        out["describe"] = {k: row.get(k) for k in ("leader", "leader_epoch", "replicas", "isr", "under_replicated")}
        end = acked[-1][1]
        out["all_caught_up"] = wait_until(
            lambda: set(client.describe_topic("r")["partitions"][0]["replica_log_end_offsets"].values())
            == {client.offsets("r", 0)[1]})
        leader_dir = client.registry.placement("r", 0)["log_dir"]
        dirs = [leader_dir] + sorted(glob.glob(leader_dir + "@*"))
        out["identical"] = [len(dirs), len({log_bytes(d) for d in dirs}), len(log_bytes(leader_dir))]

        # One follower's node goes: after replica_lag_ms the ISR shrinks to 2 and acks=all goes on.
        state = row
        followers = [n for n in state["replicas"] if n != state["leader"]]
        cluster.remove_node(nodes[followers[0]], allow_graceful=False)
        more = [producer.send("r", b"w%d" % i).result(60) for i in range(50)]
        out["acked_with_one_follower_gone"] = len(more)
        out["isr_after_one"] = wait_until(lambda: len(client.describe_topic("r")["partitions"][0]["isr"]) == 2)

        # The second follower goes: below min_insync_replicas acks=all fails, retriable.
        cluster.remove_node(nodes[followers[1]], allow_graceful=False)
        out["isr_after_two"] = wait_until(lambda: len(client.describe_topic("r")["partitions"][0]["isr"]) == 1)
        out["leader_status"] = ray.get(client.partition_actor("r", 0).replica_status.remote())
        strict = client.producer(acks="all", retry=RetryPolicy(max_tries=2, delay_s=0.1, deadline_s=10))
        try:
            strict.send("r", b"refused").result(60)
            out["refused"] = None
        except NotEnoughReplicasError as err:
            out["refused"] = [type(err).__name__, err.retriable]
        except Exception as err:
            out["refused"] = [type(err).__name__, str(err)]
        ones = client.producer(acks=1)
        ones.send("r", b"acks1").result(60)  # acks=1 still works on the leader

        consumer = client.consumer(["r"], group="g", auto_offset_reset="earliest")
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 250 and time.monotonic() < deadline:
            seen += [m.value for m in consumer.poll(timeout_ms=500)]
        out["seen_prefix_ok"] = seen[:250] == [b"v%d" % i for i in range(200)] + [b"w%d" % i for i in range(50)]
        out["seen"] = len(seen)
        for p in (producer, ones):
            p.close()
        try:
            strict.close()  # its refused message is reported once more
        except Exception:
            pass
        consumer.close()
        client.delete_topic("r")
        client.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


def test_replicas_on_three_nodes_acks_all_and_not_enough_replicas(run_cluster_script):
    out = run_cluster_script(SCRIPT)

    name, message, retriable = out["too_few_nodes"]
    assert name == "ConfigError" and "replication_factor 4" in message and not retriable
    assert not out["toomany_exists"]
    assert out["acked"] == 200
    described = out["describe"]
    assert described["leader_epoch"] == 0 and described["leader"] == described["replicas"][0]
    assert sorted(described["replicas"]) == ["disk-a", "disk-b", "disk-c"]
    assert sorted(described["isr"]) == ["disk-a", "disk-b", "disk-c"] and not described["under_replicated"]
    assert out["all_caught_up"]
    replicas, distinct, size = out["identical"]
    assert replicas == 3 and distinct == 1 and size > 0  # the same bytes at the same offsets
    assert out["acked_with_one_follower_gone"] == 50 and out["isr_after_one"]
    assert out["isr_after_two"]
    assert out["refused"] == ["NotEnoughReplicasError", True]
    assert out["seen_prefix_ok"], out["seen"]
