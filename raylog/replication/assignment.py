"""Which disk nodes hold the replicas of a partition, and the names of the
replica actors and their log directories.

Replicas of partition ``p`` go to ``replication_factor`` consecutive nodes
of the sorted disk nodes, starting at the node the partition would have
without replication (so the leaders are spread as the partitions are today);
they are therefore on distinct nodes. The first replica is the preferred
(and first) leader: its actor has the partition's plain actor name and its
log the partition's plain directory; a follower's actor and directory carry
``@<node>``. That first node is kept in the ``state`` node as ``origin``
(:class:`~raylog.replication.state.PartitionState`): the names stay when a
reassignment changes the replicas, also once ``origin`` holds none.

The functions keep no state.
"""

from __future__ import annotations

from raylog.errors import ConfigError
from raylog.storage.fileops import replica_log_dir

__all__ = ["assign_replicas", "replica_actor_name", "replica_log_dir"]


def assign_replicas(partitions: int, nodes: list, replication_factor: int, offset: int = 0) -> list[list]:
    """Per partition, the nodes of its replicas (distinct; leader first).
    Raises :class:`ConfigError` when fewer disk nodes are alive than
    ``replication_factor``."""
    if replication_factor > len(nodes):
        raise ConfigError(
            f"replication_factor {replication_factor} needs as many alive disk nodes, but only "
            f"{len(nodes)} offer local disk ({', '.join(n.identity for n in nodes) or 'none'}); add disk nodes "
            f"(ray start --resources '{{\"raylog_disk\": 1}}' --labels raylog-node=<name>) or lower the factor"
        )
    return [
        [nodes[(offset + p + i) % len(nodes)] for i in range(replication_factor)] for p in range(partitions)
    ]


def replica_actor_name(plain_name: str, node: str, leader_at_create: str) -> str:
    """The actor name of the replica on ``node``."""
    return plain_name if node == leader_at_create else f"{plain_name}@{node}"

