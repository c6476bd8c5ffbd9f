"""A local multi-node Ray cluster of disk nodes, for multi-node tests and
the replication benches (``ray.cluster_utils.Cluster`` made by the caller,
who also shuts it down)::

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        nodes = start_disk_nodes(cluster, ("disk-a", "disk-b", "disk-c"))
        ...
        cluster.remove_node(nodes["disk-a"], allow_graceful=False)
        cluster.add_node(**disk_node_args("disk-a"))      # the same node back, on the same disk
    finally:
        ray.shutdown()
        cluster.shutdown()

and the small waits those scripts share. The functions keep no state.
"""

from __future__ import annotations

import glob
import os
import time

from raylog.config import DISK_RESOURCE, NODE_LABEL


def disk_node_args(label: str, *, object_store_memory: int | None = None) -> dict:
    """``Cluster.add_node`` arguments of the disk node ``label`` (one CPU;
    the same arguments add it back after a removal)."""
    args = {"num_cpus": 1, "resources": {DISK_RESOURCE: 1}, "labels": {NODE_LABEL: label}}
    if object_store_memory is not None:
        args["object_store_memory"] = object_store_memory
    return args


def start_disk_nodes(cluster, labels, *, object_store_memory: int | None = None) -> dict:
    """Add a disk node per label to ``cluster``, wait for them and join Ray
    from this process; ``{label: node}``."""
    import ray  # heavy: imported when used

    nodes = {label: cluster.add_node(**disk_node_args(label, object_store_memory=object_store_memory))
             for label in labels}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
    return nodes


def wait_until(check, timeout_s: float = 30.0, interval_s: float = 0.2) -> bool:
    """Whether ``check()`` came true within ``timeout_s`` (checked once more at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return check()


def log_bytes(directory: str) -> bytes:
    """The bytes of a partition log directory's segments, in offset order."""
    parts = []
    for path in sorted(glob.glob(os.path.join(directory, "*.log"))):
        with open(path, "rb") as f:
            parts.append(f.read())
    return b"".join(parts)
