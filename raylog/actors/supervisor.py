"""The supervisor: every registered partition is served again, and every
deleted one is gone, whenever a raylog cluster (re)starts.

Partition actors are detached Ray actors; they die with the Ray cluster
(``ray down``, a head restart, ``deploy/local_cluster.py stop``, the end of
the embedded default), while their logs stay on the disk nodes and their
topics stay in ZooKeeper. The **supervisor** is one small detached actor per
raylog cluster (named ``<cluster>/supervisor`` in the ``raylog`` namespace,
no CPU), started by the cluster's own start-up: ``raylog.connect()`` for the
embedded default, ``deploy/local_cluster.py start``, the head's start
commands of a ``ray up`` config (``raylog supervisor start``). On start and
then every ``interval_s`` it runs one **repair pass** (:func:`repair`):

1. **tombstones first** (:meth:`raylog.zk.registry.Registry.tombstones`):
   for each log of a deleted partition, a partition actor of the deleted
   topic that still runs on that directory is shut down and its log
   deleted; otherwise, when the log's node is alive, a small task on that
   node empties the directory (:func:`remove_log`) and removes the
   tombstone. A node that is down keeps its tombstone until it is back.
2. **every registered partition** that no partition actor serves (no
   endpoint, or an endpoint left by an actor that is gone: ZooKeeper keeps
   a dead session's ephemeral nodes until the session times out, also
   across its own restart) gets its partition actor again, pinned to its
   node (when that node is alive): the actor recovers its log and
   registers its endpoint with a newer epoch; for a replicated partition,
   each replica, leader or follower (:mod:`raylog.replication.repair`);
3. **lost replicas** (their node gone for ``replica_replace_after_s``) move
   to an alive disk node (:func:`raylog.replication.repair.replace_lost`).

``raylog topics repair`` (:meth:`raylog.Client.repair`) runs the same pass
by hand and reports per partition what it found and did.

A returning partition actor also honours the delete itself, before it
opens its log (:func:`check_before_serving`): it refuses to serve a topic
that no longer exists, and empties a directory that has a tombstone. So a
topic deleted while its node was down and created again under the same
name starts empty, whichever of the two gets there first.

Thread-safety: :class:`Supervisor` is actor-confined; its one timer thread
and the method threads share only the registry (thread-safe) and an
``Event``. The functions here keep no state.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import threading
import time

from raylog import auth
from raylog.actors.partition import actor_name, start_partition_actor
from raylog.actors.placement import disk_nodes, scheduling_options
from raylog.config import NAMESPACE
from raylog.errors import LogInUseError, RaylogError, StorageError, UnknownTopicError
from raylog.replication.repair import replace_lost, serve_replicas
from raylog.zk.registry import Registry
from raylog.zk.registry_base import TOPIC_NAME
from raylog.zk.session import connect_kazoo

log = logging.getLogger(__name__)

#: the file a partition log's owner holds an exclusive ``flock`` on
#: (:mod:`raylog.storage.log`); removing a log takes the same lock
LOCK_NAME = "lock"
#: how often the supervisor runs a repair pass
DEFAULT_INTERVAL_S = 5.0
#: how long one pass waits for partition actors it started to answer
START_WAIT_S = 30.0
#: how long one pass waits for a log removal task on a node
REMOVE_WAIT_S = 30.0


def supervisor_name(cluster: str) -> str:
    return f"{cluster}/supervisor"


# ----------------------------------------------------------------------------
# removing deleted logs


#: the files raylog writes in a partition directory: segments and their
#: indexes (``<20 digits>.<kind>``), and named files such as ``lock``,
#: ``recovery-point``, ``producer-state``, ``leader-epoch``; each maybe ``.tmp``
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


def remove_log(log_dir: str, *, remove_directory: bool) -> bool:
    """Empty ``log_dir`` while holding its lock (so never under a running
    partition actor); with ``remove_directory`` also remove the lock file
    and the directory. False if there was no such directory. Raises
    :class:`LogInUseError` if an owner holds the lock, StorageError if
    there is no lock file (not a partition log: nothing is removed). Callers
    acting on a tombstone check the directory first (:func:`check_partition_directory`)."""
    if not os.path.isdir(log_dir):
        return False
    lock_path = os.path.join(log_dir, LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise StorageError(f"refusing to remove {log_dir!r}: it holds no raylog lock file ({err.strerror}); "
                           f"it is not a partition log and was left untouched", directory=log_dir) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LogInUseError(
                f"the deleted partition log {log_dir} is still open by its owner; it is removed "
                f"once that partition actor stops",
                directory=log_dir,
            ) from None
        for entry in os.listdir(log_dir):
            if entry == LOCK_NAME:
                continue
            path = os.path.join(log_dir, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        if remove_directory:
            os.unlink(lock_path)
            os.rmdir(log_dir)
        return True
    finally:
        os.close(fd)


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


def _remove_log_task(zookeeper: str, cluster: str, node: str, log_dir: str) -> str:
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


# ----------------------------------------------------------------------------
# one repair pass


def _row(topic, partition, node, state, detail="") -> dict:
    return {"topic": topic, "partition": partition, "node": node, "state": state, "detail": detail}


def _running_actor(cluster: str, topic: str, partition: int):
    import ray  # heavy (Ray): imported when used

    try:
        return ray.get_actor(actor_name(cluster, topic, partition), namespace=NAMESPACE)
    except ValueError:
        return None


def remove_deleted(registry, zookeeper: str, nodes: list[dict], *, topic: str | None = None,
                   token: bytes | None = None, wait_s: float = REMOVE_WAIT_S) -> list[dict]:
    """Step 1 of a repair pass: honour the tombstones (of ``topic``, or all).
    Returns one row per tombstone: ``removed``, ``pending`` (node down, or
    the log still open) or ``failed``. ``token``: the cluster's, which a
    partition actor's shutdown requires."""
    import ray  # heavy (Ray): imported when used


    alive = {n.identity for n in disk_nodes(nodes)}
    rows, pending = [], []
    for stone in registry.tombstones().values():
        if topic is not None and stone["topic"] != topic:
            continue
        name, p, node, log_dir = stone["topic"], stone["partition"], stone["node"], stone["log_dir"]
        actor = _running_actor(registry.cluster, name, p)
        if actor is not None:
            try:
                stats = ray.get(actor.stats.remote(), timeout=wait_s)
                started_ms = (time.time() - stats["uptime_s"]) * 1000
                if stats["log_dir"] == log_dir and started_ms < stone["deleted_ms"]:
                    # an actor of the deleted topic, still serving: stop it and its log
                    ray.get(actor.shutdown.remote(delete_data=True, token=token), timeout=wait_s)
                    ray.kill(actor, no_restart=True)
                    registry.remove_tombstone(node, log_dir)
                    rows.append(_row(name, p, node, "removed", "stopped the deleted topic's actor"))
                    continue
            except ray.exceptions.RayActorError:
                pass  # gone meanwhile (delete_topic stops it too): its log is removed below
            except Exception as err:  # noqa: BLE001 - one actor's failure stays its own
                rows.append(_row(name, p, node, "failed", f"stopping its actor: {err}"))
                continue
        if node not in alive:
            rows.append(_row(name, p, node, "pending", "its node is not alive; removed when it is back"))
            continue
        task = ray.remote(num_cpus=0, max_retries=0)(_remove_log_task).options(**scheduling_options(node, nodes))
        pending.append((stone, task.remote(zookeeper, registry.cluster, node, log_dir)))
    if pending:
        ray.wait([ref for _, ref in pending], num_returns=len(pending), timeout=wait_s)
    for stone, ref in pending:
        name, p, node = stone["topic"], stone["partition"], stone["node"]
        try:
            rows.append(_row(name, p, node, "removed", ray.get(ref, timeout=0)))
        except ray.exceptions.GetTimeoutError:
            rows.append(_row(name, p, node, "pending", f"removal still running after {wait_s:g} s"))
        except Exception as err:  # noqa: BLE001
            cause = getattr(err, "cause", None) or err
            state = "pending" if isinstance(cause, LogInUseError) else "failed"
            rows.append(_row(name, p, node, state, str(cause).strip().splitlines()[-1]))
    return rows


def serve_registered(registry, zookeeper: str, nodes: list[dict], *, topic: str | None = None,
                     host: str | None = None, token: bytes | None = None,
                     wait_s: float = START_WAIT_S) -> list[dict]:
    """Step 2 of a repair pass: start the partition actor of every
    registered partition (of ``topic``, or all) that has no endpoint, on its
    node if that is alive. Returns one row per partition: ``serving``
    (already), ``started``, ``starting`` (not answering within ``wait_s``),
    ``node down`` or ``failed``."""
    import ray  # heavy (Ray): imported when used


    alive = {n.identity for n in disk_nodes(nodes)}
    names = [topic] if topic is not None else registry.list_topics()
    rows, started = [], []
    for name in names:
        try:
            config = registry.topic_config(name)
            placements = registry.placements(name)
            endpoints = registry.endpoints(name)
        except UnknownTopicError:
            if topic is not None:
                raise
            continue  # deleted meanwhile
        for p in range(config.partitions):
            place = placements.get(p) or {}
            node = place.get("node")
            if config.replication_factor > 1 and node and place.get("log_dir"):
                # every replica, leader and followers (raylog.replication.repair)
                more, starting = serve_replicas(registry, zookeeper, nodes, alive, name, p, config, place,
                                                host=host, token=token)
                rows += more
                started += starting
            elif p in endpoints and _running_actor(registry.cluster, name, p) is not None:
                rows.append(_row(name, p, node, "serving", f"{endpoints[p]['host']}:{endpoints[p]['port']}"))
            elif not node or not place.get("log_dir"):
                rows.append(_row(name, p, node, "failed", "no placement recorded (a create that did not finish)"))
            elif node not in alive:
                rows.append(_row(name, p, node, "node down", "its node is not alive; served when it is back"))
            else:
                try:
                    actor = start_partition_actor(
                        zookeeper=zookeeper, cluster=registry.cluster, topic=name, partition=p,
                        log_dir=place["log_dir"], config=config, node_identity=node, nodes=nodes,
                        host=host, token=token,
                    )
                    started.append((name, p, node, actor.ping.remote()))
                except RaylogError as err:
                    rows.append(_row(name, p, node, "failed", str(err)))
    if started:
        ray.wait([ref for *_, ref in started], num_returns=len(started), timeout=wait_s)
    for name, p, node, ref in started:
        try:
            ray.get(ref, timeout=0)
            rows.append(_row(name, p, node, "started"))
        except ray.exceptions.GetTimeoutError:
            rows.append(_row(name, p, node, "starting", f"not answering after {wait_s:g} s"))
        except Exception as err:  # noqa: BLE001 - a constructor's error, for this partition only
            cause = getattr(err, "cause", None) or err
            rows.append(_row(name, p, node, "failed", str(cause).strip().splitlines()[-1]))
    rows.sort(key=lambda r: (r["topic"], r["partition"]))
    return rows


def repair(registry, zookeeper: str, *, topic: str | None = None, host: str | None = None,
           token: bytes | None = None, wait_s: float = START_WAIT_S, lost_since: dict | None = None) -> list[dict]:
    """One repair pass: :func:`remove_deleted`, :func:`serve_registered`, and
    with ``lost_since`` (the supervisor's) :func:`replace_lost`."""
    import ray  # heavy (Ray): imported when used

    nodes = ray.nodes()
    removed = remove_deleted(registry, zookeeper, nodes, topic=topic, token=token, wait_s=wait_s)
    rows = removed + serve_registered(registry, zookeeper, nodes, topic=topic, host=host, token=token,
                                      wait_s=wait_s)
    if lost_since is not None:
        alive = {n.identity for n in disk_nodes(nodes)}
        rows += replace_lost(registry, zookeeper, nodes, alive, lost_since, topic=topic, host=host, token=token)
    return rows


# ----------------------------------------------------------------------------
# the actor


class Supervisor:
    """The body of the supervisor actor (see the module docstring)."""
    def __init__(self, zookeeper: str, cluster: str, host: str | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S):

        self.zookeeper, self.cluster, self.host = zookeeper, cluster, host
        # Derived here, as the partition actors do (raylog.auth): never
        # taken from whoever starts the supervisor.
        self.token = auth.cluster_token(cluster)
        self.interval_s = interval_s
        self.zk = connect_kazoo(zookeeper, token=self.token, cluster=cluster)
        self.registry = Registry(self.zk, cluster)
        self.passes = 0
        self.last: list[dict] = []
        #: (topic, partition, node) -> when a replica's node was first seen gone
        self.lost_since: dict = {}
        self._lock = threading.Lock()  # one pass at a time
        self._last_failure: str | None = None  # the last failed pass's error, while it repeats
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raylog-supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.repair()
                self._last_failure = None
            except RaylogError as err:
                # An expected fault (ZooKeeper away, a node restarting) is
                # tried again at the next pass, with no traceback: the
                # client reports a ZooKeeper outage once (raylog.zk.session).
                # Another error is a warning line, once while it repeats.
                failure = f"{type(err).__name__}: {err}"
                level = logging.DEBUG if err.retriable or failure == self._last_failure else logging.WARNING
                self._last_failure = failure
                log.log(level, "raylog supervisor of %s: repair pass failed (%s); trying again in %g s",
                        self.cluster, failure, self.interval_s)
            except Exception:  # noqa: BLE001 - unexpected: its traceback, then try again next time
                log.exception("raylog supervisor of %s: repair pass failed", self.cluster)
            self._stopped.wait(self.interval_s)

    def repair(self, topic: str | None = None, wait_s: float = START_WAIT_S) -> list[dict]:
        with self._lock:
            rows = repair(self.registry, self.zookeeper, topic=topic, host=self.host, token=self.token,
                          wait_s=wait_s, lost_since=self.lost_since)
            self.passes += 1
            before = {(r["topic"], r["partition"], r["state"]) for r in self.last}
            for row in rows:  # what changed since the last pass
                if row["state"] != "serving" and (row["topic"], row["partition"], row["state"]) not in before:
                    # what went as it should is info; what waits or failed, a warning
                    level = logging.INFO if row["state"] in ("started", "removed") else logging.WARNING
                    log.log(level, "raylog supervisor: %s-%s on %s: %s %s", row["topic"], row["partition"],
                            row["node"], row["state"], row["detail"])
            if topic is None:
                self.last = rows
            return rows

    def status(self) -> dict:
        return {"cluster": self.cluster, "zookeeper": self.zookeeper, "passes": self.passes,
                "interval_s": self.interval_s, "last": self.last}

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        self._stopped.set()


def start_supervisor(zookeeper: str, cluster: str, *, host: str | None = None, interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = 60.0, wait: bool = True):
    """Start the cluster's supervisor unless it runs; return its handle,
    with ``wait`` once it answers (it has then started its first pass)."""
    import ray  # heavy (Ray): imported when used

    actor = (
        ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=4)(Supervisor)
        .options(name=supervisor_name(cluster), namespace=NAMESPACE, lifetime="detached", get_if_exists=True)
        .remote(zookeeper, cluster, host, interval_s)
    )
    if not wait:
        return actor
    ready, _ = ray.wait([actor.ping.remote()], timeout=timeout_s)
    if not ready:
        raise RaylogError(f"the raylog supervisor of cluster {cluster!r} did not start within {timeout_s:g} s",
                          retriable=True)
    return actor


def find_supervisor(cluster: str):
    """The running supervisor of ``cluster``, or None."""
    import ray  # heavy (Ray): imported when used

    try:
        return ray.get_actor(supervisor_name(cluster), namespace=NAMESPACE)
    except ValueError:
        return None


def stop_supervisor(cluster: str, timeout_s: float = 10.0) -> bool:
    """Stop the cluster's supervisor (True if one ran)."""
    import ray  # heavy (Ray): imported when used

    actor = find_supervisor(cluster)
    if actor is None:
        return False
    try:
        ray.get(actor.stop.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - it is killed just below anyway
        pass
    ray.kill(actor, no_restart=True)
    return True
