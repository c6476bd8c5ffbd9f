"""``raylog.connect()`` and the :class:`Client`: topics, producers, consumers.

``raylog.connect()`` with no arguments is the **embedded default**: it
starts a local Ray (with one node that offers local disk), a ZooKeeper of
its own on 127.0.0.1, and keeps partition logs under a temporary directory
that ``close()`` removes (pass ``data_dir=`` to keep them). Given
``zookeeper="host:2181"`` and ``ray_address="auto"`` it joins an existing
cluster instead and starts nothing but the partition actors of the topics
it creates.

Thread-safety: a :class:`Client` may be shared by threads; producers and
consumers it creates are documented in their own modules.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time

from raylog.actors.partition import NAMESPACE, actor_name, start_partition_actor
from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL, disk_nodes, spread
from raylog.config import TopicConfig
from raylog import _log
from raylog.errors import BrokerUnavailableError, ClosedError, ConfigError, RayUnavailableError, RequestTimeoutError
from raylog.metadata import ConnectionSettings, Metadata

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "/tmp/raylog"
#: where the embedded default keeps its ZooKeeper's data inside a kept data_dir
EMBEDDED_ZOOKEEPER_DIR = ".zookeeper"
LOCAL_NODE = "local"
#: how long ``connect(ray_address=...)`` waits for the Ray head's GCS port
#: to accept a TCP connection before it gives up (Ray itself would retry
#: for minutes)
RAY_CONNECT_TIMEOUT_S = 5.0


#: the clients made in this process and not closed yet, oldest first (see
#: current_client); appended and removed under the GIL, safe from any thread
_OPEN_CLIENTS: list = []


def current_client() -> "Client | None":
    """The client this process connected last and has not closed (what
    ``raylog.connect()`` returned), or None; used by the readers and writers
    that take an optional ``client=``."""
    return _OPEN_CLIENTS[-1] if _OPEN_CLIENTS else None


def _close_all_at_exit() -> None:
    """At interpreter exit, close every client not closed yet, newest first,
    silently: each stops its producers and consumers, then (embedded
    default) its partition and producer actors, ZooKeeper, and Ray.

    Registered (again) by every new :class:`Client`, so that it runs before
    the ``ray.shutdown`` that ``ray.init`` registered (``atexit`` runs
    handlers last registered first)."""
    if not _OPEN_CLIENTS:
        return
    for name in ("raylog", "raylog_spark", "kazoo"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    for client in reversed(list(_OPEN_CLIENTS)):
        try:
            client.close()
        except BaseException:  # noqa: BLE001 - at exit, nothing is left to tell
            pass


class Client:
    """A connection to one raylog cluster (a ZooKeeper root and a Ray cluster)."""

    def __init__(
        self,
        *,
        zookeeper: str,
        cluster: str = "default",
        data_dir: str = DEFAULT_DATA_DIR,
        token: bytes | None = None,
        data_host: str | None = None,
        _owned_zookeeper=None,
        _owns_ray: bool = False,
        _owned_data_dir: str | None = None,
        _zk=None,
    ):
        from raylog.zk.registry import Registry
        from raylog.zk.server import connect_kazoo

        # token None: the settings derive the cluster's token (raylog.auth)
        self.settings = ConnectionSettings(zookeeper=zookeeper, cluster=cluster, token=token)
        self.data_dir = data_dir
        self.data_host = data_host
        self._owned_zookeeper = _owned_zookeeper
        self._owns_ray = _owns_ray
        self._owned_data_dir = _owned_data_dir
        self._zk = _zk if _zk is not None else connect_kazoo(zookeeper)
        self.registry = Registry(self._zk, cluster)
        self.metadata = Metadata(self.registry, self.settings)
        self._children: list = []  # producers and consumers to close with the client
        self._closed = False
        self._actors: list = []  # producer actors to stop with an embedded client
        _OPEN_CLIENTS.append(self)
        atexit.unregister(_close_all_at_exit)
        atexit.register(_close_all_at_exit)

    # -- topics --------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, *, timeout_s: float = 120.0, **settings) -> TopicConfig:
        """Create a topic and start one partition actor per partition, spread
        over the nodes that offer local disk. Returns the topic's config.

        ``settings`` are :class:`raylog.TopicConfig` fields (retention_ms,
        retention_bytes, segment_bytes, segment_ms, flush_messages, flush_ms,
        max_message_bytes, max_inflated_bytes, max_producer_ids).

        A topic of the same name deleted before starts empty: what its
        delete left to do (tombstones, an actor still running) is done
        first, and a partition actor empties a directory a tombstone names
        before it serves (:mod:`raylog.actors.supervisor`)."""
        import ray

        from raylog.actors.supervisor import remove_deleted

        self._check_open()
        config = TopicConfig(partitions=partitions, **settings)
        nodes = ray.nodes()
        disks = disk_nodes(nodes)
        placement = spread(partitions, disks, offset=sum(name.encode()) % max(1, len(disks)))
        remove_deleted(self.registry, self.settings.zookeeper, nodes, topic=name, token=self.settings.token)
        self.registry.create_topic(name, config)
        try:
            for p, node in enumerate(placement):
                self.registry.set_placement(name, p, node.identity, self.log_dir(name, p))
            self._serve(name, config, nodes, timeout_s)
        except BaseException:
            self._stop_actors(name, partitions, delete_data=True)
            self.registry.delete_topic(name)
            remove_deleted(self.registry, self.settings.zookeeper, ray.nodes(), topic=name, token=self.settings.token)
            raise
        return config

    def log_dir(self, topic: str, partition: int) -> str:
        """Where a new partition's log goes on its node:
        ``<data_dir>/<cluster>/<topic>-<partition>``, so that clusters
        sharing a data directory never share a partition directory (each is
        also locked by its owner, see :mod:`raylog.storage.log`)."""
        return os.path.join(self.data_dir, self.settings.cluster, f"{topic}-{partition}")

    def repair(self, topic: str | None = None, timeout_s: float = 60.0) -> list[dict]:
        """Serve again every registered partition (of ``topic``, or all)
        that is not served, and remove the logs of deleted topics that are
        still on their nodes: one repair pass of the cluster's supervisor
        (:mod:`raylog.actors.supervisor`), which is started here if it does
        not run. Returns one row per partition and per pending delete:
        ``{"topic", "partition", "node", "state", "detail"}`` with state
        ``serving``, ``started``, ``starting``, ``node down``, ``removed``,
        ``pending`` or ``failed``. Joins the Ray cluster."""
        import ray

        from raylog.auth import check

        self._check_open()
        check(self.settings.cluster, self.settings.token, "repairing partitions")
        if topic is not None:
            self.registry.topic_config(topic)  # UnknownTopicError before anything starts
        supervisor = self.start_supervisor()
        return ray.get(supervisor.repair.remote(topic, timeout_s), timeout=3 * timeout_s + 30)

    def start_supervisor(self, interval_s: float | None = None, wait: bool = True):
        """Start the cluster's supervisor unless it runs (it serves every
        registered partition again after a restart); return its handle
        (with ``wait``, once it answers)."""
        from raylog.actors.supervisor import DEFAULT_INTERVAL_S, start_supervisor

        return start_supervisor(
            self.settings.zookeeper,
            self.settings.cluster,
            host=self.data_host,
            interval_s=DEFAULT_INTERVAL_S if interval_s is None else interval_s,
            wait=wait,
        )

    def _serve(self, name: str, config: TopicConfig, nodes: list[dict], timeout_s: float) -> None:
        import ray

        from raylog.auth import check

        check(self.settings.cluster, self.settings.token, f"serving topic {name!r}")
        actors = []
        for p in range(config.partitions):
            place = self.registry.placement(name, p)
            actors.append(
                start_partition_actor(
                    zookeeper=self.settings.zookeeper,
                    cluster=self.settings.cluster,
                    topic=name,
                    partition=p,
                    log_dir=place["log_dir"],
                    config=config,
                    node_identity=place["node"],
                    nodes=nodes,
                    host=self.data_host,
                    token=self.settings.token,
                )
            )
        refs = [a.ping.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            raise BrokerUnavailableError(
                f"only {len(ready)} of {len(refs)} partition actors of {name!r} started within "
                f"{timeout_s:g} s; check that the nodes holding them are alive (ray status)"
            )
        ray.get(ready)  # raise a constructor's error, if any

    def _actor(self, topic: str, partition: int):
        import ray

        try:
            return ray.get_actor(actor_name(self.settings.cluster, topic, partition), namespace=NAMESPACE)
        except ValueError:
            return None

    def partition_actor(self, topic: str, partition: int):
        """The Ray actor handle of a partition (for control calls and tests)."""
        actor = self._actor(topic, partition)
        if actor is None:
            raise BrokerUnavailableError(f"no partition actor runs for {topic}-{partition}")
        return actor

    def _stop_actors(self, topic: str, partitions: int, delete_data: bool) -> None:
        import ray

        from raylog.auth import check

        check(self.settings.cluster, self.settings.token, f"stopping the partitions of {topic!r}")

        actors = [a for a in (self._actor(topic, p) for p in range(partitions)) if a is not None]
        refs = [a.shutdown.remote(delete_data=delete_data, token=self.settings.token) for a in actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=30)
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)

    def delete_topic(self, name: str, timeout_s: float = 30.0) -> None:
        """Delete the topic and its logs on every node.

        The topic leaves ZooKeeper first, in one transaction with a
        tombstone per partition log; then the running partition actors stop
        and delete their logs, and logs without a running actor are removed
        by a task on their node. A log whose node is down (or, from a
        client outside Ray, every log) keeps its tombstone, which the
        cluster's supervisor honours as soon as it can, and which a
        partition actor honours before it serves that directory again."""
        import ray

        from raylog.actors.supervisor import remove_deleted
        from raylog.auth import check

        self._check_open()
        config = self.registry.topic_config(name)
        if ray.is_initialized():
            check(self.settings.cluster, self.settings.token, f"deleting topic {name!r}")
        self.registry.delete_topic(name)
        from raylog.groups.admin import delete_topic_offsets

        # Committed byte offsets would point mid-message in a re-created topic.
        delete_topic_offsets(self._zk, self.settings.cluster, name)
        if not ray.is_initialized():
            return  # the supervisor removes the logs
        self._stop_actors(name, config.partitions, delete_data=True)
        remove_deleted(self.registry, self.settings.zookeeper, ray.nodes(), topic=name, token=self.settings.token,
                       wait_s=timeout_s)

    def list_topics(self) -> list[str]:
        return self.registry.list_topics()

    def describe_topic(self, name: str) -> dict:
        """Config, and per partition: node, log directory, whether it is
        served, endpoint, log start offset and high watermark (a partition
        not served has no endpoint: :meth:`repair` serves it again)."""
        config = self.registry.topic_config(name)
        placements = self.registry.placements(name)
        endpoints = self.registry.endpoints(name)
        partitions = []
        for p in range(config.partitions):
            endpoint = endpoints.get(p)
            row = {
                "partition": p,
                "node": placements.get(p, {}).get("node"),
                "log_dir": placements.get(p, {}).get("log_dir"),
                "served": endpoint is not None,
                "endpoint": None if endpoint is None else f"{endpoint['host']}:{endpoint['port']}",
                "epoch": None if endpoint is None else endpoint.get("epoch"),
                "log_start_offset": None,
                "high_watermark": None,
            }
            if endpoint is not None:
                try:
                    row["log_start_offset"], row["high_watermark"] = self.offsets(name, p)
                except BrokerUnavailableError:
                    pass
            partitions.append(row)
        return {"topic": name, "config": config, "partitions": partitions}

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """``(log start offset, high watermark)`` of a partition."""
        from raylog.transfer.connection import BrokerConnection

        host, port = self.metadata.endpoint(topic, partition, refresh=True, wait_s=5.0)
        with BrokerConnection(host, port, token=self.settings.token, timeout_s=10) as conn:
            return conn.offsets(topic, partition)

    def offsets_for_times(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """``{partition: offset}``: in every partition of ``topic``, the offset
        of the first message whose timestamp is at or after ``timestamp_ms``
        (ms since the epoch), or the high watermark when there is none
        (OFFSETS_FOR_TIME, backed by the segments' time indexes). A message
        inside a compressed set is found as its wrapper's offset."""
        from raylog.transfer.connection import BrokerConnection

        out = {}
        for p in range(self.metadata.partitions(topic)):
            host, port = self.metadata.endpoint(topic, p, refresh=True, wait_s=5.0)
            with BrokerConnection(host, port, token=self.settings.token, timeout_s=10) as conn:
                out[p] = conn.offset_for_time(topic, p, int(timestamp_ms))
        return out

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The high watermark of every partition of ``topic``."""
        return {p: self.offsets(topic, p)[1] for p in range(self.metadata.partitions(topic))}

    # -- producers and consumers ---------------------------------------------

    def producer(self, **options):
        """A :class:`raylog.Producer` (batch_size, linger_ms, compression,
        acks 0/1/"all", enable_idempotence, retry, audit...); ``send`` returns
        a future of ``(partition, offset)``."""
        from raylog.producer import Producer

        self._check_open()
        if options.get("audit"):
            self.ensure_audit_topic()
        producer = Producer(self.metadata, **options)
        self._children.append(producer)
        return producer

    def producer_actor(self, **options):
        """A Ray actor handle wrapping a producer, for Ray apps:
        ``ray.get(handle.send_batch.remote("clicks", [b"v1", b"v2"]))``
        returns once that call's messages are acknowledged (or raises for
        them alone)."""
        from raylog.actors.producer import producer_actor

        self._check_open()
        if options.get("audit"):
            self.ensure_audit_topic()
        handle = producer_actor(self.settings, **options)
        self._actors.append(handle)
        return handle

    def consumer(self, topics, group: str | None = None, **options):
        """A :class:`raylog.Consumer` of ``topics`` (a name or a list);
        with ``group``, coordinated with the other members of the group."""
        from raylog.consumer import Consumer

        self._check_open()
        if options.get("audit"):
            self.ensure_audit_topic()
        consumer = Consumer(self.metadata, topics, group=group, **options)
        self._children.append(consumer)
        return consumer

    # -- audit ---------------------------------------------------------------

    def ensure_audit_topic(self) -> None:
        """Create the audit topic (one partition) unless it exists."""
        from raylog.audit import AUDIT_TOPIC
        from raylog.errors import TopicExistsError

        if not self.registry.topic_exists(AUDIT_TOPIC):
            try:
                self.create_topic(AUDIT_TOPIC, partitions=1, flush_ms=100)
            except TopicExistsError:
                pass

    def audit(self, topic: str | None = None, group: str | None = None, timeout_s: float = 30.0) -> list[dict]:
        """Produced vs consumed per time window, from the audit topic; rows
        whose ``short`` list is non-empty name the groups that fell short."""
        from raylog.audit import AUDIT_TOPIC, audit_report
        from raylog.consumer import Consumer

        import ray

        if not self.registry.topic_exists(AUDIT_TOPIC):
            return []
        # Events acknowledged just now become readable at the partition's next
        # flush: ask for it when in Ray, else wait for the timer to run it.
        if ray.is_initialized():
            end = ray.get(self.partition_actor(AUDIT_TOPIC, 0).flush.remote())
        else:
            time.sleep(2 * self.registry.topic_config(AUDIT_TOPIC).flush_ms / 1000.0 + 0.05)
            end = self.offsets(AUDIT_TOPIC, 0)[1]
        events = []
        consumer = Consumer(self.metadata, AUDIT_TOPIC, auto_offset_reset="earliest")
        try:
            deadline = time.monotonic() + timeout_s
            while (consumer.position(AUDIT_TOPIC, 0) or 0) < end:
                if time.monotonic() > deadline:
                    raise RequestTimeoutError(f"could not read the audit topic to offset {end} in {timeout_s} s")
                events.extend(m.value for m in consumer.poll(timeout_ms=500))
        finally:
            consumer.close()
        return audit_report(events, topic=topic, group=group)

    # -- consumer groups -----------------------------------------------------

    def list_groups(self) -> list[str]:
        """Consumer groups with live members or committed offsets."""
        from raylog.groups.admin import list_groups

        return list_groups(self._zk, self.settings.cluster)

    def describe_group(self, group: str, timeout_s: float = 5.0) -> list[dict]:
        """One row per partition the group reads: owner, committed offset,
        end offset (high watermark), ``lag_bytes`` and
        ``lag_messages_estimate`` (an estimate, from the mean size of the
        messages at the committed offset); plus idle members. Partitions are
        asked concurrently within one overall ``timeout_s``; one that does
        not answer shows None. See :func:`raylog.groups.admin.describe_group`."""
        from raylog.groups.admin import describe_group

        return describe_group(self._zk, self.settings.cluster, group, self._partition_info, timeout_s=timeout_s)

    def _partition_info(self, topic: str, partition: int, committed: int | None) -> tuple[int, float | None]:
        """``(high watermark, mean message size near committed)`` of a partition."""
        from raylog.storage.message import decode_messages
        from raylog.transfer.connection import BrokerConnection

        host, port = self.metadata.endpoint(topic, partition, refresh=True, wait_s=2.0)
        with BrokerConnection(host, port, token=self.settings.token, timeout_s=5) as conn:
            start, end = conn.offsets(topic, partition)
            at = committed if committed is not None and start <= committed < end else start
            if at >= end:
                return end, None
            data = conn.fetch(topic, partition, at, 64 * 1024).data
        # The sample counts stored messages (a compressed wrapper counts as its inner messages).
        records, used = decode_messages(data, at)
        return end, (used / len(records) if records else None)

    def delete_group(self, group: str) -> None:
        """Delete a consumer group's committed offsets. Refused with
        :class:`raylog.GroupActiveError` while it has live members."""
        from raylog.groups.admin import delete_group

        delete_group(self._zk, self.settings.cluster, group)

    def reset_offsets(self, group: str, topic: str, to: str, *, offset: int | None = None,
                      timestamp_ms: int | None = None, partitions=None, dry_run: bool = True) -> list[dict]:
        """Move a group's committed offsets of ``topic`` (Kafka's
        ``--reset-offsets``), for every partition or those in ``partitions``:

        * ``to="earliest"`` / ``"latest"``: the log start / the high watermark;
        * ``to="offset", offset=N``: byte offset N (a message boundary inside the log);
        * ``to="timestamp", timestamp_ms=T``: the first message whose timestamp
          is at least T (the high watermark if none). Found by reading the
          partition's message timestamps from its start through the fetch
          path: it costs a scan of the partition.

        With ``dry_run`` (the default) nothing is written: the rows show
        ``current`` and ``new`` per partition. Refused with
        :class:`raylog.GroupActiveError` while the group has live members.
        """
        from raylog.errors import ConfigError
        from raylog.groups.admin import refuse_if_active, reset_offsets

        refuse_if_active(self._zk, self.settings.cluster, group, "reset the offsets of")  # before any scan
        if to not in ("earliest", "latest", "offset", "timestamp"):
            raise ConfigError(f"to must be 'earliest', 'latest', 'offset' or 'timestamp', got {to!r}")
        if (to == "offset") != (offset is not None) or (to == "timestamp") != (timestamp_ms is not None):
            raise ConfigError("give offset= exactly with to='offset' and timestamp_ms= exactly with to='timestamp'")
        count = self.metadata.partitions(topic)
        chosen = sorted(range(count) if partitions is None else {int(p) for p in partitions})
        bad = [p for p in chosen if not 0 <= p < count]
        if bad:
            raise ConfigError(f"{topic} has partitions 0..{count - 1}; no partition {bad}")
        targets = {p: self._reset_target(topic, p, to, offset, timestamp_ms) for p in chosen}
        return reset_offsets(self._zk, self.settings.cluster, group, topic, targets, dry_run=dry_run)

    def _reset_target(self, topic: str, partition: int, to: str, offset: int | None, timestamp_ms: int | None) -> int:
        from raylog.errors import InvalidOffsetError, OffsetOutOfRangeError, RaylogError
        from raylog.storage.message import decode_messages
        from raylog.transfer.connection import BrokerConnection

        host, port = self.metadata.endpoint(topic, partition, refresh=True, wait_s=5.0)
        with BrokerConnection(host, port, token=self.settings.token, timeout_s=10) as conn:
            start, end = conn.offsets(topic, partition)
            if to == "earliest":
                return start
            if to == "latest":
                return end
            if to == "offset":
                if not start <= offset <= end:
                    raise OffsetOutOfRangeError(
                        f"{topic}-{partition}: offset {offset} is outside the log [{start}, {end}]",
                        offset=offset, earliest=start, latest=end)
                if offset < end:
                    try:
                        decode_messages(conn.fetch(topic, partition, offset, 64 * 1024).data, offset)
                    except RaylogError as err:
                        raise InvalidOffsetError(
                            f"{topic}-{partition}: offset {offset} is not the start of a message ({err}); "
                            f"use a message's offset or next_offset", offset=offset) from err
                return offset
            # to == "timestamp": the first message at or after timestamp_ms
            at = start
            while at < end:
                data = conn.fetch(topic, partition, at, 1 << 20).data
                records, used = decode_messages(data, at)
                for record_offset, ts, _key, _value in records:
                    if ts >= timestamp_ms:
                        return record_offset
                if used == 0:
                    break
                at += used
            return end

    # -- life cycle ----------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise ClosedError("the client is closed; call raylog.connect() again")

    def close(self) -> None:
        """Close producers and consumers made here; in the embedded default
        also stop, in this order, the partition actors and producer actors,
        ZooKeeper, and Ray. Idempotent; also runs at interpreter exit for a
        client not closed (silently then)."""
        if self._closed:
            return
        self._closed = True
        if self in _OPEN_CLIENTS:
            _OPEN_CLIENTS.remove(self)
        for child in reversed(self._children):
            try:
                child.close()
            except Exception as err:  # noqa: BLE001
                log.warning("closing %s failed: %s", type(child).__name__, err)
        if self._owns_ray:
            from raylog.actors.supervisor import stop_supervisor

            try:
                stop_supervisor(self.settings.cluster)  # first: it would serve them again
            except Exception as err:  # noqa: BLE001
                log.warning("stopping the supervisor failed: %s", err)
            self._stop_all_actors()
        self._zk.stop()
        self._zk.close()
        if self._owned_zookeeper is not None:
            self._owned_zookeeper.stop()
        if self._owns_ray:
            import ray

            ray.shutdown()
        if self._owned_data_dir is not None:
            shutil.rmtree(self._owned_data_dir, ignore_errors=True)

    def _stop_all_actors(self) -> None:
        """The partition actors of every topic (logs kept), then the
        producer actors made here: nothing in Ray holds a ZooKeeper session
        when ZooKeeper stops."""
        import ray

        for topic in self.registry.list_topics():
            try:
                self._stop_actors(topic, self.registry.topic_config(topic).partitions, delete_data=False)
            except Exception as err:  # noqa: BLE001
                log.warning("stopping partitions of %s failed: %s", topic, err)
        handles, self._actors = self._actors, []
        for handle in handles:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(
    zookeeper: str | None = None,
    ray_address: str | None = None,
    data_dir: str | None = None,
    *,
    cluster: str = "default",
    token: bytes | str | None = None,
    num_cpus: int | None = None,
    verbose: bool = False,
) -> Client:
    """Connect to a raylog cluster, or start the embedded default.

    - ``raylog.connect()``: local Ray + a ZooKeeper started here + logs in a
      temporary directory removed by ``close()``;
    - ``raylog.connect(data_dir="/tmp/rl")``: the same, logs kept there,
      and ZooKeeper's data in ``/tmp/rl/.zookeeper``: a later connect with
      the same ``data_dir`` serves the topics again (its supervisor,
      :mod:`raylog.actors.supervisor`, starts every partition actor);
    - ``raylog.connect(zookeeper="host:2181", ray_address="auto")``: an
      existing cluster (``data_dir`` defaults to ``/tmp/raylog`` on each node).

    ``token``: the cluster's token, for a process that cannot derive it
    (outside Ray, without Ray's auth token); by default the client derives
    it (see :mod:`raylog.auth`). Every data port requires it.

    Every connection has a deadline: ZooKeeper 10 s, the Ray head
    :data:`RAY_CONNECT_TIMEOUT_S`; past it a :class:`ZooKeeperUnavailableError`
    or :class:`RayUnavailableError` names the address and what to check.

    Quiet by default (see :mod:`raylog._log`): raylog logs warnings only,
    and the embedded default keeps Ray's start-up notices and its Java
    workers' info lines out of the output; ``verbose=True`` (or
    ``RAYLOG_LOG_LEVEL=INFO``) lets them through.
    """
    import ray

    quiet = _log.configure(verbose)
    if isinstance(token, str):
        token = token.encode()
    embedded_zk = None
    owns_ray = False
    owned_data_dir = None
    zk = None
    try:
        if zookeeper is not None:
            # A wrong address fails here, within its deadline, before Ray starts.
            from raylog.zk.server import connect_kazoo

            zk = connect_kazoo(zookeeper)
        if zookeeper is None:
            from raylog.zk.server import EmbeddedZooKeeper

            # With a kept data_dir the topics are kept too: ZooKeeper's data
            # lives beside the logs, and the supervisor serves them again.
            zk_dir = None if data_dir is None else os.path.join(data_dir, EMBEDDED_ZOOKEEPER_DIR)
            embedded_zk = EmbeddedZooKeeper(data_dir=zk_dir).start()
            zookeeper = embedded_zk.connect_string
        data_host = None
        if not ray.is_initialized():
            if ray_address is None:
                _log.quiet_ray_start(quiet)
                ray.init(
                    address="local",  # a local Ray of our own, never a stray cluster
                    num_cpus=num_cpus,
                    resources={DISK_RESOURCE: 1},
                    labels={NODE_LABEL: LOCAL_NODE},
                    include_dashboard=False,
                    configure_logging=True,
                    logging_level=logging.WARNING,
                    log_to_driver=True,
                )
                if quiet:
                    _log.quiet_forwarded_lines()
                owns_ray = True
                data_host = "127.0.0.1"
            else:
                _present_ray_token()
                check_ray_reachable(ray_address)
                ray.init(address=ray_address, logging_level=logging.WARNING)
        elif ray_address is None and embedded_zk is not None:
            data_host = "127.0.0.1"
        if data_dir is None:
            if embedded_zk is not None:
                # A fresh embedded ZooKeeper knows no topic, so its logs must
                # be fresh too (also when the caller started Ray): a shared
                # default directory would serve an earlier run's messages
                # under a re-created topic's name.
                data_dir = owned_data_dir = tempfile.mkdtemp(prefix="raylog-data-")
            else:
                data_dir = DEFAULT_DATA_DIR
        client = Client(
            zookeeper=zookeeper,
            cluster=cluster,
            data_dir=data_dir,
            token=token,
            data_host=data_host,
            _owned_zookeeper=embedded_zk,
            _owns_ray=owns_ray,
            _owned_data_dir=owned_data_dir,
            _zk=zk,
        )
        if owns_ray:
            # The embedded cluster's start-up: every topic kept in data_dir
            # is served again, with no client call.
            try:
                client.start_supervisor(wait=False)
            except BaseException:
                client.close()
                raise
        return client
    except BaseException:
        if zk is not None:
            zk.stop()
            zk.close()
        if owns_ray:
            ray.shutdown()
        if embedded_zk is not None:
            embedded_zk.stop()
        if owned_data_dir is not None:
            shutil.rmtree(owned_data_dir, ignore_errors=True)
        raise


def _present_ray_token() -> None:
    """Make this driver present Ray's token to a cluster at an explicit
    address, as ``ray start`` turned token auth on for it, when a token is
    at hand and ``RAY_AUTH_MODE`` does not say otherwise.

    Setting the variable is not enough once ``ray`` is imported: Ray reads
    its config (the auth mode among it) at import, so it is read again here,
    and the token loader's cache is dropped."""
    if "RAY_AUTH_MODE" in os.environ:
        return  # the user's choice
    if not (
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or os.path.exists(os.path.expanduser("~/.ray/auth_token"))
    ):
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def ray_head(ray_address: str) -> tuple[str, int] | None:
    """``(host, port)`` of the GCS that ``ray.init(address=ray_address)``
    would join (``"auto"`` read from ``RAY_ADDRESS`` or this node's last
    ``ray start``), or None when there is no address to probe (``"auto"``
    with nothing found: Ray then fails at once by itself)."""
    from ray._private.services import canonicalize_bootstrap_address

    address = ray_address.strip()
    if address.startswith("ray://"):  # Ray Client: probe its server port
        address = address[len("ray://") :]
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"ray_address {ray_address!r} is not ray://HOST:PORT")
        return host, int(port)
    try:
        canonical = canonicalize_bootstrap_address(address)
    except ValueError:
        raise ConfigError(
            f"ray_address {ray_address!r} is not HOST:PORT, 'auto' or 'local'"
        ) from None
    if canonical is None:
        return None
    host, _, port = canonical.rpartition(":")
    return host.strip("[]"), int(port)


def check_ray_reachable(ray_address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`RayUnavailableError` unless the Ray head named by
    ``ray_address`` accepts a TCP connection within ``timeout_s`` (Ray's own
    join retries for minutes against an address where nothing listens)."""
    from raylog.retry import RetryPolicy

    head = ray_head(ray_address)
    if head is None:
        return
    host, port = head

    def probe() -> None:
        with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
            pass

    policy = RetryPolicy(max_tries=20, delay_s=0.2, max_delay_s=1.0, deadline_s=timeout_s)
    try:
        policy.call(probe, retry_on=(OSError,))
    except OSError as err:
        raise RayUnavailableError(
            f"could not reach the Ray cluster at {ray_address!r} ({host}:{port}: "
            f"{err.strerror or type(err).__name__}) within {timeout_s:g}s; check that its head "
            f"runs ('ray status --address {host}:{port}') and that the address is the GCS "
            f"address 'ray start --head' printed",
            address=ray_address,
        ) from None
