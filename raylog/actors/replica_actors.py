"""The partition actors as :mod:`raylog.replication` sees them: the
implementation of :class:`raylog.replication.replica_actors.ReplicaActors`
that the supervisor and the client hand to a reassignment or a repair."""

from __future__ import annotations

from raylog.actors.partition import start_partition_actor
from raylog.actors.placement import disk_nodes
from raylog.actors.removal import remove_deleted


class PartitionActors:
    """Starts partition actors pinned to their node; removes deleted logs.
    Keeps no state."""

    def alive(self, nodes: list[dict]) -> set[str]:
        return {n.identity for n in disk_nodes(nodes)}

    def start(self, **kwargs):
        return start_partition_actor(**kwargs)

    def remove_logs(self, registry, zookeeper: str, nodes: list[dict], *, topic: str, token: bytes | None):
        return remove_deleted(registry, zookeeper, nodes, topic=topic, token=token)


#: the one instance callers hand in
PARTITION_ACTORS = PartitionActors()
