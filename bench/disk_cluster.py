"""A local multi-node Ray cluster for the replication benches: a
``ray.cluster_utils.Cluster`` with a head (the driver) and disk nodes
labelled ``disk-a``, ``disk-b`` ..., a ZooKeeper of its own, and a raylog
client on them (as the multi-node tests and the fault runner start them).

::

    with disk_cluster(3) as (cluster, nodes, client):
        client.create_topic("t", replication_factor=3)

``nodes`` is ``{label: node}``. Everything started is stopped by its handle
on the way out, even on failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

STORE_BYTES = 200 * 1024 * 1024


def node_kwargs(label: str) -> dict:
    """``Cluster.add_node`` arguments of the disk node ``label`` (the same to add it back)."""
    from raylog.testing.clusters import disk_node_args

    return disk_node_args(label, object_store_memory=STORE_BYTES)


@contextlib.contextmanager
def disk_cluster(disks: int = 3, *, name: str = "bench-replication"):
    import ray
    from ray.cluster_utils import Cluster

    from raylog.client import Client
    from raylog.testing.clusters import start_disk_nodes
    from raylog.zk.server import EmbeddedZooKeeper

    work = tempfile.mkdtemp(prefix="rlb-", dir="/tmp")  # Ray's socket paths must stay short
    zookeeper = EmbeddedZooKeeper(data_dir=os.path.join(work, "zookeeper"))
    cluster = client = None
    try:
        zookeeper.start()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "include_dashboard": False, "object_store_memory": STORE_BYTES,
            "temp_dir": os.path.join(work, "ray")})
        nodes = start_disk_nodes(cluster, [f"disk-{chr(ord('a') + i)}" for i in range(disks)],
                                 object_store_memory=STORE_BYTES)
        client = Client(zookeeper=zookeeper.connect_string, cluster=name, data_dir=os.path.join(work, "data"),
                        data_host="127.0.0.1")
        yield cluster, nodes, client
    finally:
        if client is not None:
            try:
                client.close()
            except Exception as err:  # noqa: BLE001
                print(f"closing the client failed: {err}", file=sys.stderr)
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        zookeeper.stop()
        shutil.rmtree(work, ignore_errors=True)
