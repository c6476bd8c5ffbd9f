"""Moving the replicas of a partition to other disk nodes (Kafka's
kafka-reassign-partitions), by hand (:meth:`raylog.Client.reassign_partition`,
``raylog topics reassign``) or by the supervisor for a replica whose node is
gone (:mod:`raylog.replication.repair`).

The steps, each change of the ``state`` node a compare-and-set (re-read and
redone when another writer, such as the leader shrinking its ISR, got there
first; never a blind write):

1. **check** the target (:func:`check_target`): distinct alive disk nodes,
   as many as the topic's ``replication_factor``;
2. **add**: ``replicas`` becomes the current replicas followed by the new
   ones (outside the ISR), and a follower actor starts on each new node
   (its actor name and log directory by the partition's ``origin``,
   :mod:`raylog.replication.assignment`); the leader reads the new
   ``replicas`` (:data:`~raylog.replication.leader.REFRESH_INTERVAL_S`) and
   serves their fetches;
3. **wait** until every target node is in the ISR, at most ``timeout_s``;
   else the new replicas are taken out again and their actors and logs
   removed, and :class:`ReassignmentTimeoutError` (retriable) is raised;
4. **shrink**: ``replicas`` becomes the target (plus the leader while it is
   not in it, marked ``removing`` so that no repair starts it again), the
   ISR loses the replicas that go;
5. **move the lead** when the leader is not in the target: it hands the
   lead to an in-sync target replica (:mod:`raylog.replication.handoff`:
   leader epoch + 1, no write refused for longer than the handoff); if that
   does not complete, its actor shuts down (its ``replicas/<node>`` node
   goes with its ZooKeeper session) and an in-sync target replica takes over
   as after a failover (:func:`~raylog.replication.state.take_over`); then
   the old leader leaves ``replicas``;
6. **remove** the replicas that went: their actors are killed and their
   logs get a tombstone, honoured at once when the node is alive, else by
   the supervisor once it is back (:mod:`raylog.actors.supervisor`).

Retries: a compare-and-set that loses to another writer is redone under
:data:`CAS_RETRY` (a :class:`~raylog.retry.RetryPolicy`); the waits follow
the ``state`` node with a ZooKeeper watch. A new replica that does not
start is a retriable :class:`ReassignmentTimeoutError` only when a later
try may succeed (:func:`start_failure_retriable`); any other error
propagates as it is, after the new replicas were taken out again.

The functions keep no state. Ray is imported inside them (heavy, lazy).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from kazoo.recipe.watchers import DataWatch

from raylog.config import NAMESPACE, actor_name
from raylog.errors import InvalidReassignmentError, RaylogError, ReassignmentTimeoutError, UnknownPartitionError
from raylog.replication.admin import request_handoff
from raylog.replication.assignment import replica_actor_name, replica_log_dir
from raylog.replication.handoff import choose_target
from raylog.replication.replica_actors import ReplicaActors
from raylog.replication.state import compare_and_set, read_state, running_replicas, state_path
from raylog.retry import RetryPolicy

log = logging.getLogger(__name__)

#: how many times a compare-and-set is redone after losing to another writer
CAS_TRIES = 50
#: the retries of a compare-and-set that lost (nothing else is retried)
CAS_RETRY = RetryPolicy(max_tries=CAS_TRIES, delay_s=0.005, max_delay_s=0.1, deadline_s=None)
#: how long the handoff of the lead to a target replica may take before the old leader is stopped instead
HANDOFF_TIMEOUT_S = 10.0
#: how long a shutdown call to a replica actor that goes may take
STOP_WAIT_S = 10.0


def check_target(topic: str, partition: int, config, state, target: list[str], alive: set[str]) -> list[str]:
    """The target replicas, checked; raises :class:`InvalidReassignmentError`
    (a :class:`ConfigError`) or :class:`UnknownPartitionError`."""
    if not 0 <= partition < config.partitions:
        raise UnknownPartitionError(f"topic {topic!r} has partitions 0..{config.partitions - 1}, not {partition}",
                                    topic=topic, partition=partition)
    if state is None or config.replication_factor < 2:
        raise InvalidReassignmentError(
            f"{topic}-{partition} is not replicated (replication_factor {config.replication_factor}); only the "
            f"replicas of a replicated topic can be reassigned", topic=topic, partition=partition)
    target = [str(n) for n in target]
    doubled = sorted({n for n in target if target.count(n) > 1})
    if doubled:
        raise InvalidReassignmentError(f"the target replicas name {', '.join(doubled)} more than once",
                                       topic=topic, partition=partition)
    if len(target) != config.replication_factor:
        raise InvalidReassignmentError(
            f"{len(target)} target replicas for {topic}-{partition}, whose replication_factor is "
            f"{config.replication_factor}; name that many nodes", topic=topic, partition=partition)
    down = [n for n in target if n not in alive]
    if down:
        raise InvalidReassignmentError(
            f"the target replicas {', '.join(down)} are not alive disk nodes (alive: "
            f"{', '.join(sorted(alive)) or 'none'})", topic=topic, partition=partition)
    return target


class _LostRace(Exception):
    """Another writer changed the ``state`` node between the read and the
    compare-and-set: read it again (the only error :func:`_update` retries)."""


def _update(zk, paths, topic, partition, change, retry: RetryPolicy = CAS_RETRY):
    """Apply ``change(state) -> state | None`` by compare-and-set, re-read
    and redone under ``retry`` when another writer won; the state written
    (or read, when ``change`` returns None: nothing to do). Any other error
    (ZooKeeper unreachable, a bad node) propagates at once."""

    def once():
        state, version = read_state(zk, paths, topic, partition)
        new = change(state)
        if new is None or new == state:
            return state
        if compare_and_set(zk, paths, topic, partition, new, version) is None:
            raise _LostRace()
        return new

    try:
        return retry.call(once, retry_on=(_LostRace,))
    except _LostRace:
        raise ReassignmentTimeoutError(
            f"{topic}-{partition}: the state node kept changing under {retry.max_tries} writes",
            topic=topic, partition=partition) from None


def _wait_state(zk, paths, topic, partition, check, deadline: float):
    """The ``state`` node once ``check(state)`` holds, or as it is at the
    deadline; read again each time a watch on it fires (no polling)."""
    changed = threading.Event()
    done = False

    def on_change(data, stat):
        changed.set()
        return False if done else None  # (False: the watch stops)

    DataWatch(zk, state_path(paths, topic, partition), on_change)
    try:
        while True:
            changed.clear()
            state = read_state(zk, paths, topic, partition)[0]
            left = deadline - time.monotonic()
            if check(state) or left <= 0:
                return state
            changed.wait(left)
    finally:
        done = True


def start_failure_retriable(err: BaseException) -> bool:
    """Whether a new replica that did not start may start on a later try:
    it did not answer in time, or its actor died (its node went), or a
    raylog error says it is retriable. Anything else (a refused token, a
    bad config, a bug) is not."""
    import ray.exceptions

    if isinstance(err, RaylogError):
        return err.retriable
    return isinstance(err, (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError,
                            ray.exceptions.ActorUnavailableError))


class Reassignment:
    """One reassignment of one partition (see the module docstring)."""

    def __init__(self, zk, registry, *, zookeeper: str, topic: str, partition: int, nodes: list[dict],
                 host: str | None, token: bytes | None, actors: ReplicaActors):
        self.zk, self.registry, self.paths = zk, registry, registry.paths
        self.actors = actors
        self.zookeeper, self.cluster, self.topic, self.partition = zookeeper, registry.cluster, topic, partition
        self.nodes, self.host, self.token = nodes, host, token
        self.config = registry.topic_config(topic)
        self.plain = actor_name(self.cluster, topic, partition)
        self.place = registry.placement(topic, partition) or {}

    def _name_and_dir(self, node: str, origin: str) -> tuple[str, str]:
        return (replica_actor_name(self.plain, node, origin),
                replica_log_dir(self.place["log_dir"], node, origin))

    def run(self, target: list[str], timeout_s: float):
        found = read_state(self.zk, self.paths, self.topic, self.partition)
        alive = self.actors.alive(self.nodes)
        target = check_target(self.topic, self.partition, self.config, found and found[0], target, alive)
        deadline = time.monotonic() + timeout_s
        topic, partition, zk, paths = self.topic, self.partition, self.zk, self.paths
        state = found[0]
        adding = [n for n in target if n not in state.replicas]

        def add(s):
            return dataclasses.replace(s, replicas=s.replicas + tuple(n for n in adding if n not in s.replicas))

        state = _update(zk, paths, topic, partition, add)
        try:
            for node in adding:
                self._start(node, state.origin, deadline)
        except BaseException as err:
            self._roll_back(adding, state.origin)
            if not start_failure_retriable(err):
                raise  # not a matter of time: as it is, with its own type and advice
            raise ReassignmentTimeoutError(
                f"{topic}-{partition}: a new replica did not start ({err}); the new replicas were removed again",
                topic=topic, partition=partition) from err
        state = _wait_state(zk, paths, topic, partition, lambda s: set(target) <= set(s.isr), deadline)
        if not set(target) <= set(state.isr):
            self._roll_back(adding, state.origin)
            raise ReassignmentTimeoutError(
                f"{topic}-{partition}: the target replicas {', '.join(sorted(set(target) - set(state.isr)))} did "
                f"not join the in-sync replicas within {timeout_s:g} s (ISR {', '.join(state.isr)}); the new "
                f"replicas were removed again; retry with a longer timeout", topic=topic, partition=partition)
        log.info("%s-%d: replicas %s in sync", topic, partition, target)

        def shrink(s):
            removing = () if s.leader in target else (s.leader,)
            keep = tuple(target) + removing
            return dataclasses.replace(s, replicas=keep, isr=tuple(n for n in keep if n in s.isr),
                                       removing=removing)

        state = _update(zk, paths, topic, partition, shrink)
        gone = [n for n in found[0].replicas + tuple(adding) if n not in target]
        old_leader = state.leader if state.leader not in target else None
        for node in gone:
            if node != old_leader:
                self._remove(node, state.origin, alive)
        if old_leader is not None:
            if not self._hand_off(state, target, deadline):
                self._stop(old_leader, state.origin, delete_data=False)  # a failover instead
            state = _wait_state(zk, paths, topic, partition, lambda s: s.leader in target, deadline)
            if state.leader not in target:
                raise ReassignmentTimeoutError(
                    f"{topic}-{partition}: no target replica took the lead from {old_leader} within "
                    f"{timeout_s:g} s; the replicas are {', '.join(state.replicas)}: run the same reassignment "
                    f"again", topic=topic, partition=partition)
            state = _update(zk, paths, topic, partition, lambda s: dataclasses.replace(
                s, replicas=tuple(n for n in s.replicas if n != old_leader),
                isr=tuple(n for n in s.isr if n != old_leader), removing=()))
            self._remove(old_leader, state.origin, alive)
        return state

    def _hand_off(self, state, target: list[str], deadline: float) -> bool:
        """Move the lead to an in-sync target replica by a handoff
        (:mod:`raylog.replication.handoff`); False when it did not complete
        (the old leader then stops, and a target takes over as after a failover)."""
        import ray

        running = running_replicas(self.zk, self.paths, self.topic, self.partition)
        to = choose_target(state, running, avoid=[n for n in state.replicas if n not in target])
        if to is None or self.token is None:
            return False
        try:
            request_handoff(self.zk, self.registry, self.cluster, self.topic, self.partition, to, self.token,
                            max(1.0, min(HANDOFF_TIMEOUT_S, deadline - time.monotonic())))
            return True
        except (RaylogError, ValueError, ray.exceptions.RayError) as err:
            log.info("%s-%d: handing the lead to %s failed (%s); stopping the old leader instead", self.topic,
                     self.partition, to, err)
            return False

    def _start(self, node: str, origin: str, deadline: float):
        import ray

        name, log_dir = self._name_and_dir(node, origin)
        actor = self.actors.start(
            zookeeper=self.zookeeper, cluster=self.cluster, topic=self.topic, partition=self.partition,
            log_dir=log_dir, config=self.config, node_identity=node, nodes=self.nodes, host=self.host,
            token=self.token, replica=node, name=name)
        ray.get(actor.ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
        return actor

    def _stop(self, node: str, origin: str, *, delete_data: bool) -> bool:
        """Shut the replica actor on ``node`` down and kill it; True when it
        answered (its log then closed, and deleted with ``delete_data``)."""
        import ray

        name, _ = self._name_and_dir(node, origin)
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return False
        answered = False
        try:
            ray.get(actor.shutdown.remote(delete_data=delete_data, token=self.token), timeout=STOP_WAIT_S)
            answered = True
        except Exception as err:  # noqa: BLE001 - its node may be gone: killed below, its log tombstoned
            log.info("%s-%d: replica %s did not shut down (%s); killing it", self.topic, self.partition, node, err)
        ray.kill(actor, no_restart=True)
        return answered

    def _remove(self, node: str, origin: str, alive: set[str]) -> None:
        """The replica on ``node`` goes: its actor, then its log (now, or by
        the supervisor when its node is back)."""
        _, log_dir = self._name_and_dir(node, origin)
        self._stop(node, origin, delete_data=False)
        self.registry.add_tombstone(self.topic, self.partition, node, log_dir)
        if node in alive:
            self.actors.remove_logs(self.registry, self.zookeeper, self.nodes, topic=self.topic, token=self.token)

    def _roll_back(self, adding: list[str], origin: str) -> None:
        def drop(s):
            return dataclasses.replace(s, replicas=tuple(n for n in s.replicas if n not in adding),
                                       isr=tuple(n for n in s.isr if n not in adding))

        _update(self.zk, self.paths, self.topic, self.partition, drop)
        alive = self.actors.alive(self.nodes)
        for node in adding:
            self._remove(node, origin, alive)


def reassign_partition(zk, registry, *, zookeeper: str, topic: str, partition: int, replicas: list[str],
                       nodes: list[dict], actors: ReplicaActors, host: str | None = None,
                       token: bytes | None = None, timeout_s: float = 120.0):
    """Move the replicas of ``topic``-``partition`` to ``replicas`` (see the
    module docstring); returns the final :class:`PartitionState`."""
    run = Reassignment(zk, registry, zookeeper=zookeeper, topic=topic, partition=partition, nodes=nodes,
                       host=host, token=token, actors=actors)
    return run.run(list(replicas), timeout_s)
