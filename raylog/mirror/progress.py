"""The progress of one source partition's copy, kept in the target's ZooKeeper.

**The progress record** (``mirrors/<name>/progress/<topic>/<p>``, JSON) is
written *before* a set is sent (the intent) and again once the target
acknowledged it (:mod:`raylog.mirror.copier`: a set goes as one format-2
record batch)::

    {"seq": 17,             # the set's number (0, 1, 2, ...; for people: the target judges base_seq)
     "base_seq": 1700,      # the record sequence of its first record (the batch's baseSequence is
                            #  this modulo 2**31; the next set's is base_seq + count); absent in records of the previous
                            #  version, whose format-1 sets were numbered by "seq": read as 0
     "start": 40960,        # source offset of its first message
     "end": 45056,          # source offset after its last message (a message boundary)
     "count": 100,          # messages (records) in the set
     "bytes": 6144,         # its batch's size as sent (absent in records of older versions)
     "acked": true,         # the target acknowledged it
     "target_end": 51200,   # target offset after the set (null: unknown: stored before and
                            #  no longer remembered, or a resend of another size: an intent of
                            #  the previous version, a format-1 set, sent again as a batch)
     "last_ts": 1764130000000}  # create time of its last message, ms

Every write is a compare-and-set on the node's version: a copier that lost
its partition to another member (a rebalance, a restart) finds the version
moved and stops, so at most one copier advances a record.

**The checkpoints** (``mirrors/<name>/checkpoints/<topic>/<p>``, JSON list of
``[source offset, target offset, time ms]``, oldest first, at most
:data:`CHECKPOINTS_KEPT`): appended every few seconds from acknowledged
records; :mod:`raylog.mirror.translate` maps a source group's offsets
through them.

Thread-safety: stateless functions over a kazoo client.
"""

from __future__ import annotations

import json
import time

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

#: checkpoints kept per partition (the oldest is dropped first)
CHECKPOINTS_KEPT = 64


class LostPartition(Exception):
    """The record moved under this copier: another copier owns the partition."""


def read_progress(zk, path: str) -> tuple[dict | None, int]:
    """``(record, version)``; ``(None, -1)`` when there is none yet."""
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return None, -1
    return json.loads(data.decode()), stat.version


def write_progress(zk, path: str, record: dict, version: int) -> int:
    """Compare-and-set ``record`` at ``version`` (-1: create); the new version.
    Raises :class:`LostPartition` when the node moved."""
    data = json.dumps(record, sort_keys=True).encode()
    try:
        if version < 0:
            zk.create(path, data, makepath=True)
            return 0
        return zk.set(path, data, version=version).version
    except (BadVersionError, NodeExistsError, NoNodeError):
        raise LostPartition(path) from None


def read_checkpoints(zk, path: str) -> list[list[int]]:
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        return []
    return json.loads(data.decode())


def append_checkpoint(zk, path: str, source_offset: int, target_offset: int) -> None:
    """Append ``[source_offset, target_offset, now]`` (the copier that owns the
    partition is the only writer)."""
    points = read_checkpoints(zk, path)
    if points and points[-1][0] == source_offset:
        return
    points.append([int(source_offset), int(target_offset), int(time.time() * 1000)])
    data = json.dumps(points[-CHECKPOINTS_KEPT:]).encode()
    try:
        zk.set(path, data)
    except NoNodeError:
        try:
            zk.create(path, data, makepath=True)
        except NodeExistsError:
            zk.set(path, data)


def translate(points: list[list[int]], source_offset: int) -> int | None:
    """The target offset to resume at for a group at ``source_offset``: the
    target offset of the latest checkpoint at or before it (messages from
    there to ``source_offset`` are read again: at most one checkpoint
    interval); None when every checkpoint is after it (resume at the
    target's start: nothing is missed)."""
    best = None
    for source, target, _ in points:
        if source <= source_offset:
            best = target
    return best
