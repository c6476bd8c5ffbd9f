"""A consumer group's committed offsets, for readers that keep a group's
position themselves: :func:`raylog.read.read_raylog_stream` and
``raylog_spark.load_incremental`` read where a group stands and commit
where they got to, without joining the group (docs/design.md §4,
``consumers/<group>/offsets/<topic>/<p>``).

Stateless: each call returns a new :class:`~raylog.groups.offsets.OffsetStore`
over the given metadata's ZooKeeper session.
"""

from __future__ import annotations

from raylog.groups.offsets import OffsetStore


def offset_store(metadata) -> OffsetStore:
    """The committed offsets of every consumer group of the cluster that
    ``metadata`` (a :class:`raylog.metadata.Metadata`, e.g. ``client.metadata``)
    reads: ``committed(group, topic, partition)`` and ``commit(...)``."""
    return OffsetStore(metadata.zk, metadata.settings.cluster)
