"""Tombstones of deleted partition logs, honoured on the log's own node.

A delete (or a reassignment that takes a replica away) leaves a tombstone
in ZooKeeper (:meth:`raylog.zk.registry.Registry.add_tombstone`) for each
log it could not remove at once. Two parties honour it, both on the node
that holds the log:

* a returning partition actor, before it opens its log
  (:func:`check_before_serving`): it refuses a topic that no longer exists
  and empties a directory that has a tombstone;
* a small task the supervisor schedules on the node (:func:`remove_log_task`).

Both first check that the directory is a raylog partition directory
(:func:`check_partition_directory`): tombstones live in ZooKeeper, and this
check keeps a forged one from emptying any other directory. The removal
itself takes the log's lock (:func:`raylog.storage.fileops.remove_log`).

This module sits below the supervisor (:mod:`raylog.actors.supervisor`)
and :mod:`raylog.replication`, which both reach it. The functions keep no state.
"""

from __future__ import annotations

import logging
import os
import re

from raylog import auth
from raylog.errors import StorageError, UnknownTopicError
from raylog.storage.fileops import LOCK_NAME, remove_log
from raylog.zk.registry import Registry
from raylog.zk.registry_helpers import TOPIC_NAME
from raylog.zk.session import connect_kazoo

log = logging.getLogger(__name__)


#: the files raylog writes in a partition directory: segments and their
#: indexes (``<20 digits>.<kind>``), and named files such as ``lock``,
#: ``recovery-point``, ``producer-state``, ``leader-epoch``, ``format``; each maybe ``.tmp``
_PARTITION_FILE = re.compile(r"(\d{20}\.[a-z]+|[a-z]+(-[a-z]+)*)(\.tmp)?")


def partition_directory_problem(log_dir, cluster: str, topic, partition, node=None) -> str | None:
    """Why ``log_dir`` is not the partition directory of ``topic``-``partition``
    of ``cluster`` that a tombstone may empty, or None when it is (or is
    gone). A partition directory is an absolute, normalized path
    ``<data_dir>/<cluster>/<topic>-<partition>`` (a replica's:
    ``<topic>-<partition>@<node>``, :func:`raylog.replication.assignment.replica_log_dir`) with a valid topic name,
    not a symbolic link, holding raylog's lock file and nothing but regular
    files of the names raylog writes. Tombstones live in ZooKeeper; this
    check is what keeps a forged one from emptying any other directory."""
    if not isinstance(log_dir, str) or not os.path.isabs(log_dir) or os.path.normpath(log_dir) != log_dir:
        return "it is not an absolute, normalized path"
    if not isinstance(topic, str) or not TOPIC_NAME.fullmatch(topic) or type(partition) is not int or partition < 0:
        return f"{topic!r}-{partition!r} is not a topic and partition"
    name = os.path.basename(log_dir)
    cluster_dir = os.path.dirname(log_dir)
    if name not in (f"{topic}-{partition}", f"{topic}-{partition}@{node}") or os.path.basename(cluster_dir) != cluster:
        return f"it is not <data_dir>/{cluster}/{topic}-{partition}"
    if not os.path.lexists(log_dir):
        return None
    if os.path.islink(log_dir) or os.path.realpath(log_dir) != os.path.join(os.path.realpath(cluster_dir), name):
        return "it is a symbolic link"
    if not os.path.isdir(log_dir):
        return "it is not a directory"
    lock_path = os.path.join(log_dir, LOCK_NAME)
    if os.path.islink(lock_path) or not os.path.isfile(lock_path):
        return f"it holds no raylog lock file ({LOCK_NAME})"
    with os.scandir(log_dir) as entries:
        for entry in entries:
            if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                return f"it holds {entry.name!r}, which is not a regular file"
            if not _PARTITION_FILE.fullmatch(entry.name):
                return f"it holds {entry.name!r}, a file raylog does not write"
    return None


def check_partition_directory(log_dir, cluster: str, topic, partition, node=None) -> None:
    """Raise :class:`StorageError` (and log it) unless ``log_dir`` is the
    partition directory a tombstone may empty (:func:`partition_directory_problem`)."""
    problem = partition_directory_problem(log_dir, cluster, topic, partition, node)
    if problem is not None:
        message = (f"refusing to remove {log_dir!r} for a tombstone of {topic}-{partition} in cluster "
                   f"{cluster!r}: {problem}; it is not a raylog partition directory and was left untouched "
                   f"(the tombstone is dropped; check who writes to ZooKeeper)")
        log.error("%s", message)
        raise StorageError(message, directory=str(log_dir))


def check_before_serving(zookeeper: str, cluster: str, topic: str, partition: int, log_dir: str,
                         node: str | None = None) -> None:
    """What a (returning) partition actor does before it opens its log:
    refuse a topic that is gone (:class:`UnknownTopicError`), and empty a
    directory that a delete (or a reassignment) left a tombstone on, then
    remove the tombstone. ``node``: the replica's (default: the placement's)."""

    zk = connect_kazoo(zookeeper, token=auth.cluster_token(cluster), cluster=cluster)
    try:
        registry = Registry(zk, cluster)
        place = registry.placement(topic, partition)
        if place is None or not registry.topic_exists(topic):
            raise UnknownTopicError(
                f"partition {topic}-{partition} is not registered (the topic was deleted); "
                f"not serving its log {log_dir}",
                topic=topic,
            )
        node = node or place.get("node")
        if node and registry.tombstone(node, log_dir) is not None:
            try:
                check_partition_directory(log_dir, cluster, topic, partition, node)
            except StorageError:  # logged; the actor serves its own directory as it is
                registry.remove_tombstone(node, log_dir)
                return
            remove_log(log_dir, remove_directory=False)
            registry.remove_tombstone(node, log_dir)
            log.warning("partition %s-%d: emptied %s, the log of a deleted topic of that name", topic, partition,
                        log_dir)
    finally:
        zk.stop()
        zk.close()


def remove_log_task(zookeeper: str, cluster: str, node: str, log_dir: str) -> str:
    """Body of the task that honours one tombstone on its node."""
    zk = connect_kazoo(zookeeper, token=auth.cluster_token(cluster), cluster=cluster)
    try:
        registry = Registry(zk, cluster)
        stone = registry.tombstone(node, log_dir)
        if stone is None:
            return "already removed"
        # Keep the directory while a topic of that name exists: its actor
        # may be about to open it (it empties it itself before serving);
        # not a replica's that a reassignment took away.
        gone = stone.get("reassigned") or not registry.topic_exists(stone["topic"])
        try:
            check_partition_directory(log_dir, cluster, stone.get("topic"), stone.get("partition"), node)
        except StorageError:
            registry.remove_tombstone(node, log_dir)  # refused once, not at every pass
            raise
        existed = remove_log(log_dir, remove_directory=gone)
        registry.remove_tombstone(node, log_dir)
        return "removed" if existed else "nothing on disk"
    finally:
        zk.stop()
        zk.close()
