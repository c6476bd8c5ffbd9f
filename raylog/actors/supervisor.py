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
   node empties the directory (:func:`raylog.zk.tombstones.remove_log_task`,
   :mod:`raylog.actors.removal`) and removes the
   tombstone. A node that is down keeps its tombstone until it is back.
2. **every registered partition** that no partition actor serves (no
   endpoint, or an endpoint left by an actor that is gone: ZooKeeper keeps
   a dead session's ephemeral nodes until the session times out, also
   across its own restart) gets its partition actor again, pinned to its
   node (when that node is alive): the actor recovers its log and
   registers its endpoint with a newer epoch; for a replicated partition,
   each replica, leader or follower (:mod:`raylog.replication.repair`);
3. **lost replicas** (their node gone for ``replica_replace_after_s``) move
   to an alive disk node (:func:`raylog.replication.repair.replace_lost`);
   each such reassignment (up to two minutes: the new replica catches up)
   runs on a thread of its own, one per partition and a few at once
   (:mod:`raylog.replication.background`), so the passes go on meanwhile
   and its outcome is a row of a later pass.

``raylog topics repair`` (:meth:`raylog.Client.repair`) runs the same pass
by hand and reports per partition what it found and did.

A returning partition actor also honours the delete itself, before it
opens its log (:func:`raylog.zk.tombstones.check_before_serving`): it refuses to serve a topic
that no longer exists, and empties a directory that has a tombstone. So a
topic deleted while its node was down and created again under the same
name starts empty, whichever of the two gets there first.

Thread-safety: :class:`Supervisor` is actor-confined; its one timer thread,
the method threads and the reassignment threads share only the registry
(thread-safe), an ``Event`` and the
:class:`~raylog.replication.background.BackgroundReassignments` (thread-safe). The functions here keep no state.
"""

from __future__ import annotations

import logging
import threading

from raylog import auth
from raylog.actors.partition import start_partition_actor
from raylog.actors.placement import disk_nodes
from raylog.actors.removal import REMOVE_WAIT_S, remove_deleted
from raylog.actors.removal import row as _row
from raylog.actors.removal import running_actor as _running_actor
from raylog.actors.replica_actors import PARTITION_ACTORS
from raylog.actors.cluster_actors import find_named, stop_named
from raylog.config import NAMESPACE
from raylog.errors import RaylogError, UnknownTopicError
from raylog.replication.background import BackgroundReassignments
from raylog.replication.repair import replace_lost, serve_replicas
from raylog.storage.fileops import remove_log
from raylog.zk.registry import Registry
from raylog.zk.session import connect_kazoo
from raylog.zk.tombstones import check_before_serving, check_partition_directory, partition_directory_problem

__all__ = [  # the tombstone and removal functions stay reachable here, where they were
    "DEFAULT_INTERVAL_S", "REMOVE_WAIT_S", "START_WAIT_S", "Supervisor", "check_before_serving",
    "check_partition_directory", "find_supervisor", "partition_directory_problem", "remove_deleted",
    "remove_log", "repair", "serve_registered", "start_supervisor", "stop_supervisor", "supervisor_name",
]

log = logging.getLogger(__name__)

#: how often the supervisor runs a repair pass
DEFAULT_INTERVAL_S = 5.0
#: how long one pass waits for partition actors it started to answer
START_WAIT_S = 30.0


def supervisor_name(cluster: str) -> str:
    return f"{cluster}/supervisor"


# ----------------------------------------------------------------------------
# one repair pass


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
                                                actors=PARTITION_ACTORS, host=host, token=token)
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
           token: bytes | None = None, wait_s: float = START_WAIT_S, lost_since: dict | None = None,
           background=None) -> list[dict]:
    """One repair pass: :func:`remove_deleted`, :func:`serve_registered`, and
    with ``lost_since`` (the supervisor's) :func:`replace_lost`, whose
    reassignments run in ``background`` (the supervisor's
    :class:`~raylog.replication.background.BackgroundReassignments`) when
    given, so that the pass does not wait for them."""
    import ray  # heavy (Ray): imported when used

    nodes = ray.nodes()
    removed = remove_deleted(registry, zookeeper, nodes, topic=topic, token=token, wait_s=wait_s)
    rows = removed + serve_registered(registry, zookeeper, nodes, topic=topic, host=host, token=token,
                                      wait_s=wait_s)
    if lost_since is not None:
        alive = {n.identity for n in disk_nodes(nodes)}
        rows += replace_lost(registry, zookeeper, nodes, alive, lost_since, actors=PARTITION_ACTORS, topic=topic,
                             host=host, token=token, background=background)
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
        #: lost replicas' reassignments, run beside the passes (one per partition, a few at once)
        self.reassignments = BackgroundReassignments()
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
                          wait_s=wait_s, lost_since=self.lost_since, background=self.reassignments)
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
    return find_named(supervisor_name(cluster))


def stop_supervisor(cluster: str, timeout_s: float = 10.0) -> bool:
    """Stop the cluster's supervisor (True if one ran)."""
    return stop_named(supervisor_name(cluster), timeout_s)
