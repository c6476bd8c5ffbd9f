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
                                                                    "node", "security_protocol"}`` (and
                                                                    ``ssl_ca``, a CA certificate's PEM, over
                                                                    TLS): the Kafka listener of a disk
                                                                    node (:mod:`raylog.kafka.brokers`)
``kafka/ports/<node>``                                  persistent  the port (ASCII) the node's Kafka
                                                                    listener bound: taken again when it
                                                                    restarts, so bootstrap lists stay right
``tombstones/<id>``                                     persistent  JSON ``{"topic", "partition", "node",
                                                                    "log_dir", "deleted_ms"}``: a deleted
                                                                    partition's log still to remove
``producer-ids``                                        persistent  JSON ``{"next": id}``: the first producer
                                                                    id not yet handed out; a coordinator takes
                                                                    a block ``[next, next + size)`` by a
                                                                    versioned compare-and-set
                                                                    (:mod:`raylog.zk.producer_ids`)
``transactions/<transactional id>``                     persistent  JSON ``{producer_id, producer_epoch,
                                                                    state, partitions, groups, timeout_ms,
                                                                    started_ms, ...}``: one transactional
                                                                    producer's current transaction, written
                                                                    by the coordinator only, with a versioned
                                                                    compare-and-set
                                                                    (:mod:`raylog.zk.transactions`)
======================================================  ==========  ==========================================

A tombstone's id is :func:`tombstone_id` of its node and log directory, so
that one directory has at most one tombstone however often it is deleted.
A transactional id may be any non-empty string (as Kafka's): its node name
is :func:`transactional_id_node` of it (percent-encoded, so ``/`` and the
names ``.`` and ``..`` are safe), read back by :func:`transactional_id_of_node`.
"""

from __future__ import annotations

import hashlib
import urllib.parse

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

    # transactions (docs/design.md section 6)
    @property
    def producer_ids(self) -> str:
        """The next free block of producer ids (:mod:`raylog.zk.producer_ids`)."""
        return f"{self.root}/producer-ids"

    @property
    def transactions(self) -> str:
        return f"{self.root}/transactions"

    def transaction(self, transactional_id: str) -> str:
        """The record of one transactional id (:mod:`raylog.zk.transactions`),
        under the id's node name (:func:`transactional_id_node`)."""
        return f"{self.root}/transactions/{transactional_id_node(transactional_id)}"


def tombstone_id(node: str, log_dir: str) -> str:
    """The stable id of the tombstone of ``log_dir`` on ``node``: 32 hex
    digits of SHA-256 over both (never Python's ``hash()``)."""

    return hashlib.sha256(f"{node}\0{log_dir}".encode()).hexdigest()[:32]


#: the longest transactional id, in UTF-8 bytes (its node name is at most
#: three times as long; ZooKeeper takes far longer paths)
MAX_TRANSACTIONAL_ID_BYTES = 1024


def transactional_id_node(transactional_id: str) -> str:
    """The ZooKeeper node name of a transactional id: percent-encoded UTF-8
    (every byte but letters, digits and ``_.-~``), with a leading ``.``
    encoded too, so that no id can name ``.``, ``..`` or a path. Raises
    :class:`ConfigError` for an id that is not a non-empty str of at most
    :data:`MAX_TRANSACTIONAL_ID_BYTES` bytes."""
    if not isinstance(transactional_id, str) or not transactional_id:
        raise ConfigError(f"a transactional id is a non-empty str, got {transactional_id!r}")
    if len(transactional_id.encode("utf-8", "surrogatepass")) > MAX_TRANSACTIONAL_ID_BYTES:
        raise ConfigError(f"a transactional id is at most {MAX_TRANSACTIONAL_ID_BYTES} bytes in UTF-8; "
                          f"{transactional_id[:40]!r}... is longer: use a shorter id")
    try:
        name = urllib.parse.quote(transactional_id, safe="", errors="strict")
    except UnicodeEncodeError:
        raise ConfigError(f"a transactional id must be encodable as UTF-8, got {transactional_id!r}") from None
    return "%2E" + name[1:] if name.startswith(".") else name


def transactional_id_of_node(name: str) -> str:
    """The transactional id whose node name is ``name`` (the inverse of
    :func:`transactional_id_node`)."""
    return urllib.parse.unquote(name, errors="strict")
