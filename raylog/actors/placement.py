"""Where partitions live: nodes with local disk, their stable identities, and
the scheduling options that pin a partition actor to its node.

A node offers local disk for partition logs by advertising the custom
resource ``raylog_disk`` (any positive amount; ``ray start --resources
'{"raylog_disk": 1}'``). Ray's node id changes whenever a node restarts, so
raylog names nodes by a **stable identity** instead: the node label
``raylog-node`` (``ray start --labels raylog-node=disk-a``) when it is set,
else ``ip:<node address>``. The identity is what the registry records for
each partition, and the partition actor is scheduled with a hard constraint
on it, so it never silently moves away from its data: if its node is gone,
the actor waits for the node to come back.
"""

from __future__ import annotations

import dataclasses

from raylog.config import DISK_RESOURCE
from raylog.errors import ConfigError
from raylog.replication.assignment import assign_replicas
from raylog.storage.stable_hash import stable_bucket
from raylog.zk.nodes import NODE_LABEL, node_identity

__all__ = ["DISK_RESOURCE", "NODE_LABEL", "DiskNode", "disk_nodes", "node_identity", "place_topic",
           "scheduling_options", "spread"]



@dataclasses.dataclass(frozen=True)
class DiskNode:
    identity: str
    node_id: str
    address: str
    labelled: bool


def disk_nodes(nodes: list[dict]) -> list[DiskNode]:
    """Alive nodes that offer local disk, sorted by identity."""
    found = []
    for node in nodes:
        if not node.get("Alive") or node.get("Resources", {}).get(DISK_RESOURCE, 0) <= 0:
            continue
        found.append(
            DiskNode(
                identity=node_identity(node),
                node_id=node["NodeID"],
                address=node["NodeManagerAddress"],
                labelled=bool((node.get("Labels") or {}).get(NODE_LABEL)),
            )
        )
    found.sort(key=lambda n: n.identity)
    identities = [n.identity for n in found]
    if len(set(identities)) != len(identities):
        raise ConfigError(
            "two alive nodes share one raylog identity "
            f"({sorted(i for i in identities if identities.count(i) > 1)}); give each disk node "
            f"its own label: ray start --labels {NODE_LABEL}=<unique name>"
        )
    return found


def spread(partitions: int, nodes: list[DiskNode], offset: int = 0) -> list[DiskNode]:
    """Round-robin placement of ``partitions`` over ``nodes``."""
    if not nodes:
        raise ConfigError(
            f"no alive Ray node offers local disk for partitions; start nodes with "
            f"--resources '{{\"{DISK_RESOURCE}\": 1}}' (raylog.connect() does this for a local cluster)"
        )
    return [nodes[(offset + p) % len(nodes)] for p in range(partitions)]


def place_topic(topic: str, partitions: int, disks: list[DiskNode],
                replication_factor: int = 1) -> list[list[DiskNode]]:
    """Per partition of a new topic, the nodes of its replicas (leader
    first). The first partition goes to the node the stable hash of the
    topic's name picks (:func:`raylog.storage.stable_hash.stable_bucket`,
    the same in every process), the next ones round-robin from there; with
    ``replication_factor`` > 1 each partition's replicas are the consecutive
    nodes from its own (:func:`raylog.replication.assignment.assign_replicas`).
    Raises :class:`ConfigError` without a disk node, or with fewer than
    ``replication_factor``."""
    offset = stable_bucket(topic.encode(), max(1, len(disks)))
    leaders = spread(partitions, disks, offset=offset)  # no disk node at all: its error
    if replication_factor <= 1:
        return [[node] for node in leaders]
    return assign_replicas(partitions, disks, replication_factor, offset=offset)


def scheduling_options(identity: str, nodes: list[dict]) -> dict:
    """Ray ``.options(...)`` that pin an actor to the node of ``identity``.

    A labelled identity is pinned by label (it survives the node's restart);
    an address identity by a hard node-affinity to the node alive now.
    """
    if not identity.startswith("ip:"):
        return {"label_selector": {NODE_LABEL: identity}}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # heavy (Ray): imported when used

    for node in nodes:
        if node.get("Alive") and node_identity(node) == identity:
            return {
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
            }
    raise ConfigError(
        f"the node {identity} that holds this partition's log is not alive; bring it back "
        f"(its data lives there), then retry"
    )
