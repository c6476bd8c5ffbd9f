"""Partitions on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``):
spread over the nodes that offer disk, pinned there, and never moved away
when their node dies.

The cluster runs in a child process of its own (a process holds one Ray
driver, and this test session already has its local Ray); the child stops
its cluster through the cluster's own handle in ``finally``.
"""

from __future__ import annotations

import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import ray
    from ray.cluster_utils import Cluster

    from raylog.client import Client

    zookeeper, cluster_name, data_dir = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    out = {}
    try:
        nodes = {}
        for name in ("disk-a", "disk-b"):
            node = cluster.add_node(num_cpus=1, resources={"raylog_disk": 1}, labels={"raylog-node": name})
            nodes[name] = node
        cluster.add_node(num_cpus=1)  # compute only: holds no partitions
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        client.create_topic("spread", partitions=4)
        node_of_id = {n["NodeID"]: (n.get("Labels") or {}).get("raylog-node") for n in ray.nodes()}

        placed = {}
        for p in range(4):
            actor = client.partition_actor("spread", p)
            placed[p] = {
                "registered": client.registry.placement("spread", p)["node"],
                "running_on": node_of_id[ray.get(actor.node_id.remote())],
            }
        out["placed"] = placed

        producer = client.producer(acks=1)
        for i in range(100):
            producer.send("spread", b"v%d" % i, key=b"k%d" % i)
        producer.close()

        # The node holding disk-a's partitions dies: its actors must not move.
        victims = [p for p, w in placed.items() if w["running_on"] == "disk-a"]
        cluster.remove_node(nodes["disk-a"], allow_graceful=False)
        time.sleep(5)
        moved = {}
        for p in victims:
            actor = client.partition_actor("spread", p)
            ready, _ = ray.wait([actor.node_id.remote()], timeout=5)
            try:  # pending (waiting for its node) or unavailable: not moved
                moved[p] = node_of_id.get(ray.get(ready[0])) if ready else None
            except ray.exceptions.RayError:
                moved[p] = None
        out["after_node_loss"] = moved
        survivors = [p for p in range(4) if p not in victims]

        def serving(p):
            for _ in range(30):  # the cluster settles after a node loss
                try:
                    return ray.get(client.partition_actor("spread", p).ping.remote(), timeout=10)
                except ray.exceptions.RayError:
                    time.sleep(1)
            return False

        out["survivors_serving"] = all(serving(p) for p in survivors)
        client.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


def test_partitions_spread_over_disk_nodes_and_stay_pinned(run_cluster_script):
    result = run_cluster_script(SCRIPT)

    placed = {int(p): w for p, w in result["placed"].items()}
    assert sorted(w["registered"] for w in placed.values()) == ["disk-a", "disk-a", "disk-b", "disk-b"]
    assert all(w["registered"] == w["running_on"] for w in placed.values())
    # after disk-a died, its partitions wait for it instead of moving to disk-b
    assert result["after_node_loss"] and all(v is None for v in result["after_node_loss"].values())
    assert result["survivors_serving"]
