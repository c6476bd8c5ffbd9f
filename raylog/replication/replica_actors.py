"""What replication needs of the partition actors, as an interface.

Replication starts replica actors (a reassignment's new replicas, the
supervisor's repair of a lost one) and has the logs of the replicas it
takes away removed, but the partition actor, the placement of actors on
nodes and the removal of deleted logs live above it, in
:mod:`raylog.actors`. The callers up there hand an implementation of
:class:`ReplicaActors` in (:data:`raylog.actors.replica_actors.PARTITION_ACTORS`);
:mod:`raylog.replication` imports only this interface.
"""

from __future__ import annotations

from typing import Any, Protocol

from raylog.config import TopicConfig


class ReplicaActors(Protocol):
    """Starting replica actors and removing the logs of replicas taken away."""

    def alive(self, nodes: list[dict]) -> set[str]:
        """The identities of the alive disk nodes among ``nodes`` (``ray.nodes()``)."""

    def start(self, *, zookeeper: str, cluster: str, topic: str, partition: int, log_dir: str,
              config: TopicConfig, node_identity: str, nodes: list[dict], host: str | None,
              token: bytes | None, replica: str, name: str) -> Any:
        """Start (or find) the replica actor ``name`` of ``topic``-``partition``
        on ``node_identity``; its Ray actor handle."""

    def remove_logs(self, registry, zookeeper: str, nodes: list[dict], *, topic: str,
                    token: bytes | None) -> list[dict]:
        """Honour the tombstones of ``topic`` now (the rows of a repair report)."""
