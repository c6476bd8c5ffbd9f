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
GiB = 1024 * MiB

DAY_MS = 24 * 3600 * 1000


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

    def __post_init__(self):
        positive = ("partitions", "segment_bytes", "flush_messages", "max_message_bytes")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("retention_ms", "flush_ms", "retention_check_ms"):
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
