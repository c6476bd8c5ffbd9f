"""The ZooKeeper layout of a raylog cluster (docs/design.md §4), in one place.

Everything lives under ``/raylog/<cluster name>``:

======================================================  ==========  ==========================================
path                                                    kind        content
======================================================  ==========  ==========================================
``topics/<topic>``                                      persistent  JSON :class:`raylog.TopicConfig`
``topics/<topic>/partitions/<p>``                       persistent  JSON ``{"node": identity, "log_dir": dir}``
``topics/<topic>/partitions/<p>/endpoint``              ephemeral   JSON ``{"host", "port", "actor", "epoch"}``
``topics/<topic>/partitions/<p>/state``                 persistent  JSON ``{leader, leader_epoch, isr, origin,
                                                                    epochs, removing}``: replication
                                                                    (:mod:`raylog.replication.state`)
``topics/<topic>/partitions/<p>/replicas/<node>``       ephemeral   JSON endpoint of one replica actor
``consumers/<group>/ids/<consumer id>``                 ephemeral   JSON ``{"topics": [...], "assignors": [...]}``:
                                                                    the assignors most preferred first; none
                                                                    listed means ``range`` only
                                                                    (:mod:`raylog.groups.assignors`)
``consumers/<group>/owners/<topic>/<p>``                ephemeral   the owning consumer id (UTF-8)
``consumers/<group>/offsets/<topic>/<p>``               persistent  the next byte offset to consume (ASCII)
``consumers/<group>/kafka/<node>``                      ephemeral   JSON ``{"members": [...]}``: the group's
                                                                    Kafka-protocol members, kept by the Kafka
                                                                    listener of ``node`` that coordinates them
                                                                    (:mod:`raylog.groups.kafka_members`)
``schemas/<id>``                                        persistent  an Avro schema (JSON); sequential ids
``schemas-by-hash/<sha256>``                            persistent  the id of the schema of that canonical form
``schema-subjects/<subject>/<version>``                  persistent  the id (ASCII) of the schema registered
                                                                    as that version of the subject; versions
                                                                    are sequential (10 digits, the first 0:
                                                                    version 1) (:mod:`raylog.zk.schemas`)
``kafka/listeners/<node>``                              ephemeral   JSON ``{"host", "port", "broker_id",
                                                                    "node"}``: the Kafka listener of a disk
                                                                    node (:mod:`raylog.kafka`)
``kafka/ports/<node>``                                  persistent  the port (ASCII) the node's Kafka
                                                                    listener bound: taken again when it
                                                                    restarts, so bootstrap lists stay right
``tombstones/<id>``                                     persistent  JSON ``{"topic", "partition", "node",
                                                                    "log_dir", "deleted_ms"}``: a deleted
                                                                    partition's log still to remove
======================================================  ==========  ==========================================

A tombstone's id is :func:`tombstone_id` of its node and log directory, so
that one directory has at most one tombstone however often it is deleted.
"""

from __future__ import annotations

import hashlib

from raylog.errors import ConfigError

DEFAULT_CLUSTER = "default"


class Paths:
    """Path builder for one cluster's root. Immutable; safe to share."""
    __slots__ = ("root",)

    def __init__(self, cluster: str = DEFAULT_CLUSTER):
        if not cluster or "/" in cluster:
            raise ConfigError(f"cluster name must be non-empty and contain no '/': {cluster!r}")
        self.root = f"/raylog/{cluster}"

    # topics and partitions
    @property
    def topics(self) -> str:
        return f"{self.root}/topics"

    def topic(self, topic: str) -> str:
        return f"{self.root}/topics/{topic}"

    def partitions(self, topic: str) -> str:
        return f"{self.root}/topics/{topic}/partitions"

    def partition(self, topic: str, partition: int) -> str:
        return f"{self.root}/topics/{topic}/partitions/{partition}"

    def endpoint(self, topic: str, partition: int) -> str:
        return f"{self.root}/topics/{topic}/partitions/{partition}/endpoint"

    # replication (docs/design.md section 7)
    def state(self, topic: str, partition: int) -> str:
        return f"{self.root}/topics/{topic}/partitions/{partition}/state"

    def replicas(self, topic: str, partition: int) -> str:
        return f"{self.root}/topics/{topic}/partitions/{partition}/replicas"

    def replica(self, topic: str, partition: int, node: str) -> str:
        return f"{self.root}/topics/{topic}/partitions/{partition}/replicas/{node}"

    # the Kafka protocol listeners (docs/design.md section 10)
    @property
    def kafka_listeners(self) -> str:
        return f"{self.root}/kafka/listeners"

    def kafka_listener(self, node: str) -> str:
        return f"{self.root}/kafka/listeners/{node}"

    def kafka_port(self, node: str) -> str:
        return f"{self.root}/kafka/ports/{node}"

    # consumer groups
    @property
    def groups(self) -> str:
        return f"{self.root}/consumers"

    def group(self, group: str) -> str:
        return f"{self.root}/consumers/{group}"

    def ids(self, group: str) -> str:
        return f"{self.root}/consumers/{group}/ids"

    def member(self, group: str, consumer_id: str) -> str:
        return f"{self.root}/consumers/{group}/ids/{consumer_id}"

    def kafka_members(self, group: str) -> str:
        return f"{self.root}/consumers/{group}/kafka"

    def kafka_member_node(self, group: str, node: str) -> str:
        return f"{self.root}/consumers/{group}/kafka/{node}"

    def all_owners(self, group: str) -> str:
        return f"{self.root}/consumers/{group}/owners"

    def owners(self, group: str, topic: str) -> str:
        return f"{self.root}/consumers/{group}/owners/{topic}"

    def owner(self, group: str, topic: str, partition: int) -> str:
        return f"{self.root}/consumers/{group}/owners/{topic}/{partition}"

    def all_offsets(self, group: str) -> str:
        return f"{self.root}/consumers/{group}/offsets"

    def offsets(self, group: str, topic: str) -> str:
        return f"{self.root}/consumers/{group}/offsets/{topic}"

    def offset(self, group: str, topic: str, partition: int) -> str:
        return f"{self.root}/consumers/{group}/offsets/{topic}/{partition}"

    # schemas
    @property
    def schemas(self) -> str:
        return f"{self.root}/schemas"

    def schema(self, schema_id: int) -> str:
        return f"{self.root}/schemas/{schema_id:010d}"

    @property
    def schemas_by_hash(self) -> str:
        """Schema ids by the hash of their canonical form (:mod:`raylog.zk.schemas`)."""
        return f"{self.root}/schemas-by-hash"

    @property
    def schema_subjects(self) -> str:
        """Subjects: versions of a schema under one name (:mod:`raylog.zk.schemas`)."""
        return f"{self.root}/schema-subjects"

    def schema_subject(self, subject: str) -> str:
        return f"{self.root}/schema-subjects/{subject}"

    # deleted partition logs not yet removed from their node
    @property
    def tombstones(self) -> str:
        return f"{self.root}/tombstones"

    def tombstone(self, tombstone_id: str) -> str:
        return f"{self.root}/tombstones/{tombstone_id}"


def tombstone_id(node: str, log_dir: str) -> str:
    """The stable id of the tombstone of ``log_dir`` on ``node``: 32 hex
    digits of SHA-256 over both (never Python's ``hash()``)."""

    return hashlib.sha256(f"{node}\0{log_dir}".encode()).hexdigest()[:32]
