"""What a mirror copies, and where its state lives in the target cluster.

A :class:`MirrorSpec` is picklable: the controller and every member actor
get it. The target's ZooKeeper holds, under ``/raylog/<target>/mirrors/<name>``:

=============================================  ==========  ================================
path                                           kind        content
=============================================  ==========  ================================
``mirrors/<name>``                             persistent  JSON: the spec (without the token)
``mirrors/<name>/progress/<topic>/<p>``        persistent  JSON progress record of a source
                                                           partition (:mod:`raylog.mirror.progress`)
``mirrors/<name>/checkpoints/<topic>/<p>``     persistent  JSON list of ``[source offset,
                                                           target offset, time ms]``
=============================================  ==========  ================================

``<topic>`` is the *source* topic name.
"""

from __future__ import annotations

import dataclasses
import re

from crc32c import crc32c

from raylog.errors import ConfigError

#: the group the members form on the source: ``mirror.<name>``
GROUP_PREFIX = "mirror."
#: the Ray namespace of the controller and member actors
NAMESPACE = "raylog-mirror"


@dataclasses.dataclass(frozen=True)
class MirrorSpec:
    name: str
    source_zookeeper: str
    source_cluster: str
    topics: str
    rename: str = "{topic}"
    members: int = 1
    source_token: bytes | None = None
    #: how often the source is scanned for topics that start matching
    scan_interval_s: float = 20.0
    #: how often a copier appends an offset checkpoint
    checkpoint_interval_s: float = 2.0

    def __post_init__(self):
        if not self.name or "/" in self.name:
            raise ConfigError(f"a mirror name must be non-empty without '/', got {self.name!r}")
        try:
            re.compile(self.topics)
        except re.error as err:
            raise ConfigError(f"--topics {self.topics!r} is not a regular expression: {err}") from None
        try:
            probe = self.rename.format(source=self.source_cluster, topic="t")
        except (KeyError, IndexError, ValueError) as err:
            raise ConfigError(f"rename {self.rename!r} may use only {{source}} and {{topic}}: {err}") from None
        if "{topic}" not in self.rename or "/" in probe:
            raise ConfigError(f"rename {self.rename!r} must contain {{topic}} and no '/'")
        if int(self.members) < 1:
            raise ConfigError(f"members must be at least 1, got {self.members}")

    @property
    def group(self) -> str:
        return GROUP_PREFIX + self.name

    def matches(self, topic: str) -> bool:
        return re.fullmatch(self.topics, topic) is not None and not topic.startswith("__")

    def target_topic(self, topic: str) -> str:
        return self.rename.format(source=self.source_cluster, topic=topic)

    def public(self) -> dict:
        """The spec as stored in ZooKeeper (never the token)."""
        fields = dataclasses.asdict(self)
        fields.pop("source_token")
        fields["has_token"] = self.source_token is not None
        return fields


def mirror_root(target_cluster: str, name: str | None = None) -> str:
    root = f"/raylog/{target_cluster}/mirrors"
    return root if name is None else f"{root}/{name}"


def progress_path(target_cluster: str, name: str, topic: str, partition: int) -> str:
    return f"{mirror_root(target_cluster, name)}/progress/{topic}/{partition}"


def checkpoints_path(target_cluster: str, name: str, topic: str, partition: int) -> str:
    return f"{mirror_root(target_cluster, name)}/checkpoints/{topic}/{partition}"


def controller_name(target_cluster: str, name: str) -> str:
    return f"mirror:{target_cluster}:{name}"


def member_name(target_cluster: str, name: str, index: int) -> str:
    return f"mirror:{target_cluster}:{name}:{index}"


def producer_id(target_cluster: str, name: str, source_cluster: str, topic: str, partition: int) -> int:
    """The idempotent producer id of one source partition's copier: stable
    across restarts (a function of the names only), non-negative i63. Two
    CRC32C halves over distinct inputs make a collision with a random
    producer's id (:func:`raylog.producer.sender.new_producer_id`) as unlikely
    as any two random ids."""
    key = f"{target_cluster}\0{name}\0{source_cluster}\0{topic}\0{partition}".encode()
    high = crc32c(b"mirror-hi\0" + key) & 0x7FFFFFFF
    low = crc32c(b"mirror-lo\0" + key)
    return (high << 32) | low
