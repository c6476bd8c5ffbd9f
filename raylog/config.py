"""Settings shared by the storage engine, the brokers and the clients.

:class:`TopicConfig` is what ``client.create_topic`` stores in ZooKeeper and
what every partition log of the topic is opened with. It is immutable and
validated on construction; a bad value raises :class:`raylog.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import json

from raylog.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB

#: the Ray namespace of raylog's named actors (partition actors, supervisors,
#: producer actors)
NAMESPACE = "raylog"


#: the custom Ray resource of a node that offers local disk for partition
#: logs (``ray start --resources '{"raylog_disk": 1}'``)
DISK_RESOURCE = "raylog_disk"
#: the Ray node label that names a node's stable identity
#: (``ray start --labels raylog-node=disk-a``, :mod:`raylog.zk.nodes`)
NODE_LABEL = "raylog-node"


def actor_name(cluster: str, topic: str, partition: int) -> str:
    """The name (in :data:`NAMESPACE`) of a partition's actor; a follower's
    carries ``@<node>`` (:func:`raylog.replication.assignment.replica_actor_name`)."""
    return f"{cluster}/{topic}/{partition}"


def coordinator_name(cluster: str) -> str:
    """The name (in :data:`NAMESPACE`) of the cluster's transaction
    coordinator actor (:mod:`raylog.actors.transaction_coordinator`); the
    producer finds it by this name."""
    return f"{cluster}/transaction-coordinator"


GiB = 1024 * MiB

DAY_MS = 24 * 3600 * 1000

#: the ``cleanup_policy`` values of a topic (docs/design.md section 3)
CLEANUP_DELETE = "delete"
CLEANUP_COMPACT = "compact"
CLEANUP_COMPACT_DELETE = "compact,delete"
CLEANUP_POLICIES = (CLEANUP_DELETE, CLEANUP_COMPACT, CLEANUP_COMPACT_DELETE)
#: ``max_compaction_lag_ms`` when none is set (Kafka's: the largest i64)
MAX_COMPACTION_LAG_MS = (1 << 63) - 1

#: where a position starts when none is stored, as callers name it
#: (``auto_offset_reset``, ``reset_offsets(to=...)``, Spark's
#: ``startingOffsets``): the log start, or the high watermark
EARLIEST = "earliest"
LATEST = "latest"
#: the readers' isolation levels (Kafka's names; docs/design.md §6): raylog's consumer, Ray Data, Spark
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
#: how long a client waits for a TCP connection to a data server to be
#: set up: a deadline of its own, far below a request's (a SYN to a host that
#: is cut off is never answered; the caller looks the endpoint up again in
#: ZooKeeper and retries within its own delivery deadline)
CONNECT_TIMEOUT_MS = 2000
#: a data connection whose peer acknowledges nothing (data sent, or the
#: keep-alive probes of an idle connection) for this long is dead (Linux
#: ``TCP_USER_TIMEOUT``): a request to a host that was cut off fails after
#: this, not after the request timeout, and the caller looks the endpoint up
#: again. A slow peer still acknowledges (its kernel does), so this never
#: cuts a request that is merely waiting for its reply.
DEAD_PEER_MS = 3000
#: a new leader that has not served yet (its actor still starting: on a busy
#: host, seconds) is replaced by a follower only after this long, or after
#: the topic's ``replica_lag_ms`` when that is longer
LEADER_START_GRACE_MS = 10_000
#: ``auto_offset_reset`` value that raises instead of moving the position
RESET_ERROR = "error"
#: every ``auto_offset_reset`` value a consumer accepts
OFFSET_RESETS = (EARLIEST, LATEST, RESET_ERROR)
#: default ``max_inflated_bytes`` in multiples of ``max_message_bytes``
#: (equal to :data:`raylog.storage.message.INNER_SET_FACTOR`)
INFLATED_FACTOR = 8


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    """Settings of a topic and of each of its partition logs."""

    #: number of partitions of the topic
    partitions: int = 1
    #: delete whole segments older than this (by segment modification time)
    retention_ms: int = 7 * DAY_MS
    #: delete the oldest whole segments while the log is larger; -1 for no limit
    retention_bytes: int = -1
    #: start a new segment once the active one passes this many bytes
    segment_bytes: int = 256 * MiB
    #: fsync and advance the high watermark after this many appended messages
    flush_messages: int = 10_000
    #: ... or after this many milliseconds, whichever comes first
    flush_ms: int = 50
    #: the largest message (and message set) a partition accepts
    max_message_bytes: int = 1 * MiB
    #: how often the partition checks retention
    retention_check_ms: int = 60_000
    #: roll the active segment once its first message is this old (like
    #: Kafka's ``log.roll.ms``), so time retention reaches quiet partitions
    segment_ms: int = 7 * DAY_MS
    #: the most bytes a compressed wrapper may inflate to (refused at produce
    #: time, and checked by consumers before inflating); 0 means
    #: ``INFLATED_FACTOR * max_message_bytes``
    max_inflated_bytes: int = 0
    #: producer ids whose sequences a partition remembers (idempotence);
    #: the least recently active is forgotten first
    max_producer_ids: int = 10_000
    #: replicas per partition, each on its own disk node (docs/design.md section 7)
    replication_factor: int = 1
    #: the fewest in-sync replicas with which ``acks="all"`` is accepted
    min_insync_replicas: int = 1
    #: a follower that has not caught up for this long leaves the ISR
    replica_lag_ms: int = 10_000
    #: a replica whose node has not been alive for this long moves to an
    #: alive disk node holding no replica of its partition (the
    #: supervisor's pass, :mod:`raylog.replication.repair`); 0: never
    replica_replace_after_s: int = 600
    #: when every in-sync replica is gone, let a replica outside the ISR
    #: lead (availability over consistency: acknowledged messages it lacks
    #: are lost); off by default, as in Kafka
    unclean_leader_election: bool = False
    #: what happens to old data (docs/design.md section 3): ``"delete"``
    #: (retention drops whole old segments), ``"compact"`` (the cleaner
    #: keeps the latest record of each key; records without a key are
    #: refused), or ``"compact,delete"`` (both)
    cleanup_policy: str = CLEANUP_DELETE
    #: on a compacted topic, how long a tombstone (a null value) is kept
    #: after its segment was cleaned, so that readers see the delete
    delete_retention_ms: int = DAY_MS
    #: the cleaner never touches records younger than this
    min_compaction_lag_ms: int = 0
    #: a record older than this is cleaned whatever the dirty ratio
    max_compaction_lag_ms: int = MAX_COMPACTION_LAG_MS
    #: the cleaner runs once the dirty part (bytes written since the last
    #: cleaning) is at least this share of the cleanable log, in (0, 1]
    min_cleanable_dirty_ratio: float = 0.5

    def __post_init__(self):
        positive = ("partitions", "segment_bytes", "flush_messages", "max_message_bytes", "segment_ms",
                    "max_producer_ids", "replication_factor", "min_insync_replicas", "replica_lag_ms")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("retention_ms", "flush_ms", "retention_check_ms", "max_inflated_bytes",
                     "replica_replace_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        if not isinstance(self.retention_bytes, int) or self.retention_bytes < -1:
            raise ConfigError(
                f"retention_bytes must be -1 (no limit) or a non-negative integer, "
                f"got {self.retention_bytes!r}"
            )
        if self.max_message_bytes > self.segment_bytes:
            raise ConfigError(
                f"max_message_bytes ({self.max_message_bytes}) must not exceed "
                f"segment_bytes ({self.segment_bytes})"
            )

        if not isinstance(self.unclean_leader_election, bool):
            raise ConfigError(f"unclean_leader_election must be True or False, got {self.unclean_leader_election!r}")
        if self.min_insync_replicas > self.replication_factor:
            raise ConfigError(
                f"min_insync_replicas ({self.min_insync_replicas}) must not exceed "
                f"replication_factor ({self.replication_factor})"
            )
        self._check_cleanup()
        if self.max_inflated_bytes and self.max_inflated_bytes < self.max_message_bytes:
            raise ConfigError(
                f"max_inflated_bytes ({self.max_inflated_bytes}) must be 0 (the default) or at least "
                f"max_message_bytes ({self.max_message_bytes})"
            )

    def _check_cleanup(self) -> None:
        """The compaction settings (docs/design.md section 3)."""
        policy = self.cleanup_policy
        if isinstance(policy, str):
            # Kafka writes the list either way round ("delete,compact"): one spelling is kept
            parts = sorted({part.strip() for part in policy.split(",")})
            normal = ",".join(parts)
            if normal in CLEANUP_POLICIES and normal != policy:
                object.__setattr__(self, "cleanup_policy", normal)
        if self.cleanup_policy not in CLEANUP_POLICIES:
            raise ConfigError(
                f"cleanup_policy must be one of {', '.join(repr(p) for p in CLEANUP_POLICIES)}, got {policy!r}"
            )
        for name in ("delete_retention_ms", "min_compaction_lag_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        lag = self.max_compaction_lag_ms
        if not isinstance(lag, int) or isinstance(lag, bool) or not 0 < lag <= MAX_COMPACTION_LAG_MS:
            raise ConfigError(f"max_compaction_lag_ms must be a positive integer (an i64), got {lag!r}")
        if lag < self.min_compaction_lag_ms:
            raise ConfigError(
                f"max_compaction_lag_ms ({lag}) must not be below min_compaction_lag_ms "
                f"({self.min_compaction_lag_ms}); raise the first or lower the second"
            )
        ratio = self.min_cleanable_dirty_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ConfigError(f"min_cleanable_dirty_ratio must be a number in (0, 1], got {ratio!r}")

    @property
    def compacted(self) -> bool:
        """Whether the topic is compacted (``cleanup_policy`` holds ``compact``)."""
        return self.cleanup_policy in (CLEANUP_COMPACT, CLEANUP_COMPACT_DELETE)

    @property
    def deletes_old_segments(self) -> bool:
        """Whether retention deletes old segments (``cleanup_policy`` holds ``delete``)."""
        return self.cleanup_policy in (CLEANUP_DELETE, CLEANUP_COMPACT_DELETE)

    @property
    def max_inflated_limit(self) -> int:
        """The bound on a wrapper's inflated size in effect (pass it to
        :func:`raylog.storage.decoding.decode_messages` as ``max_inflated_bytes``)."""
        return self.max_inflated_bytes or INFLATED_FACTOR * self.max_message_bytes

    def replace(self, **changes) -> "TopicConfig":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> "TopicConfig":
        raw = json.loads(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"unknown topic settings: {', '.join(sorted(unknown))}")
        return cls(**raw)
