"""Partition endpoints in the cluster registry: ``topics/<topic>/partitions/<p>/endpoint``,
ephemeral, fenced by the partition actor's epoch (see :mod:`raylog.zk.registry`)."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Callable

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import DataWatch

from raylog.errors import ConfigError, StaleEpochError, RaylogError
from raylog.zk.registry_helpers import CONTENDED_TRIES, RegistryCalls, dump_json, first_failure, load_json, translated

log = logging.getLogger(__name__)


class EndpointWatch:
    """A running :meth:`Registry.watch_endpoint`; :meth:`cancel` stops it
    (the callback is not called after ``cancel`` returns, except for a call
    already running). Thread-safe."""

    def __init__(self, topic: str, partition: int):
        self.topic = topic
        self.partition = partition
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    def __repr__(self):
        state = "cancelled" if self.cancelled else "active"
        return f"EndpointWatch({self.topic}-{self.partition}, {state})"


class EndpointRegistry:
    """The endpoint part of :class:`~raylog.zk.registry.Registry`, making
    its ZooKeeper calls through ``calls`` (thread-safety as there)."""

    def __init__(self, calls: RegistryCalls):
        self.calls = calls
        self.zk = calls.zk
        self.paths = calls.paths

    @translated("register a partition endpoint")
    def register_endpoint(
        self, topic: str, partition: int, host: str, port: int, actor: str, epoch: int
    ) -> None:
        """Publish where a partition is served, as an ephemeral node of this
        client's session.

        An endpoint left by an older epoch is replaced; one of the same epoch
        is overwritten (and taken over by this session). Raises StaleEpochError
        if a newer epoch already serves the partition: this caller is stale
        and must stop serving. Raises UnknownTopicError / UnknownPartitionError.
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {port!r}")
        self.calls.check_partition(topic, partition)
        data = dump_json({"host": host, "port": port, "actor": actor, "epoch": epoch})
        path = self.paths.endpoint(topic, partition)
        for _ in range(CONTENDED_TRIES):
            fence = self._read_fence(topic, partition)
            if fence is None:
                self.calls.ensure_partition_node(topic, partition)
                continue
            fence_data, fence_version = fence
            try:
                old, stat = self.calls.call(self.zk.get_async, path)
            except NoNodeError:
                old, stat = None, None
            tx = self.zk.transaction()
            if stat is None:
                tx.set_data(self.paths.partition(topic, partition), fence_data, fence_version)
                tx.create(path, data, ephemeral=True)
            else:
                old_epoch = self._epoch_of(old)
                if old_epoch > epoch:
                    raise StaleEpochError(
                        f"partition {topic}-{partition} is already served by a newer epoch "
                        f"({old_epoch} > {epoch}); this partition actor is stale and must stop",
                        topic=topic,
                        partition=partition,
                        epoch=epoch,
                        current_epoch=old_epoch,
                    )
                if old_epoch == epoch and stat.ephemeralOwner == self.calls.session_id():
                    # our own node: overwrite in place
                    tx.check(self.paths.partition(topic, partition), fence_version)
                    tx.set_data(path, data, stat.version)
                else:
                    # an older epoch, or the same epoch of another session:
                    # replace it, so that the node lives and dies with ours
                    tx.set_data(self.paths.partition(topic, partition), fence_data, fence_version)
                    tx.delete(path, stat.version)
                    tx.create(path, data, ephemeral=True)
            if self.calls.committed(tx, (BadVersionError, NoNodeError, NodeExistsError)):
                return
            # another registration (or a placement change) came first; look again
        raise RaylogError(
            f"could not register the endpoint of {topic}-{partition}: it kept changing "
            f"under concurrent registrations; retry",
            topic=topic,
            partition=partition,
        )

    @translated("read a partition endpoint")
    def endpoint(self, topic: str, partition: int) -> dict | None:
        """``{"host", "port", "actor", "epoch"}`` of the actor serving the
        partition, or None while none serves it (or the topic is gone)."""
        return self.calls.get_json(self.paths.endpoint(topic, partition))

    @translated("read a topic's endpoints")
    def endpoints(self, topic: str) -> dict[int, dict]:
        """``{partition: endpoint}`` for the partitions being served.
        Raises UnknownTopicError if there is no such topic."""
        return self.calls.present(topic, self.paths.endpoint)

    @translated("unregister a partition endpoint")
    def unregister_endpoint(self, topic: str, partition: int, epoch: int) -> bool:
        """Remove the endpoint if ``epoch`` registered it; True if removed.
        An endpoint of another epoch (a newer actor) is left alone."""
        path = self.paths.endpoint(topic, partition)
        for _ in range(CONTENDED_TRIES):
            fence = self._read_fence(topic, partition)
            if fence is None:
                return False
            try:
                data, stat = self.calls.call(self.zk.get_async, path)
            except NoNodeError:
                return False
            if self._epoch_of(data) != epoch:
                return False
            tx = self.zk.transaction()
            tx.check(self.paths.partition(topic, partition), fence[1])
            tx.delete(path, stat.version)
            failure = first_failure(self.calls.commit(tx))
            if failure is None:
                return True
            if not isinstance(failure, (BadVersionError, NoNodeError)):
                raise failure
            # changed meanwhile; look again
        return False

    @translated("watch a partition endpoint")
    def watch_endpoint(
        self, topic: str, partition: int, callback: Callable[[dict | None], Any]
    ) -> EndpointWatch:
        """Call ``callback(endpoint or None)`` now and whenever the
        partition's endpoint appears, changes or goes away.

        The first call happens before this method returns, in the calling
        thread; later ones on kazoo's event thread, so keep the callback
        short and hand real work to a thread of your own. An exception from
        it is logged and the watch goes on. Returning False from it, or
        calling ``cancel()`` on the returned watch, stops watching. The watch
        survives connection loss and session expiry (kazoo sets it again and
        calls back if the endpoint changed meanwhile).
        """
        self.calls.ready(f"watch the endpoint of {topic}-{partition}")
        watch = EndpointWatch(topic, partition)

        def on_change(data, stat, event=None):
            if watch.cancelled:
                return False
            try:
                value = load_json(data)
            except ValueError:
                log.warning("endpoint of %s-%d holds invalid JSON: %r", topic, partition, data)
                value = None
            try:
                keep = callback(value)
            except Exception:  # noqa: BLE001 - a watcher must not kill the watch
                log.exception("endpoint watch callback for %s-%d failed", topic, partition)
                return None
            if keep is False:
                watch.cancel()
                return False
            return None

        DataWatch(self.zk, self.paths.endpoint(topic, partition), on_change)
        return watch

    @staticmethod
    def _epoch_of(data: bytes | None) -> int:
        """The epoch stored in an endpoint node (-1 if unreadable: replace it)."""
        try:
            epoch = json.loads(data)["epoch"]
            return epoch if isinstance(epoch, int) else -1
        except (TypeError, ValueError, KeyError):
            return -1

    def _read_fence(self, topic: str, partition: int) -> tuple[bytes, int] | None:
        """The partition node's data and data version (None if it is missing).

        That version is the fencing counter of the partition's endpoint: it
        only grows, and every write that creates an endpoint node rewrites
        the same data with it as the expected version (every other endpoint
        write checks it). A write prepared from an older view of the
        endpoint therefore fails, even if the endpoint node was meanwhile
        replaced by one with the same node version (ZooKeeper restarts node
        versions at 0, so the endpoint's own version cannot tell).
        """
        try:
            data, stat = self.calls.call(self.zk.get_async, self.paths.partition(topic, partition))
        except NoNodeError:
            return None
        return data, stat.version
