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

import logging
import os
import shutil
import tempfile
import time

from raylog.actors.partition import NAMESPACE, actor_name, start_partition_actor
from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL, disk_nodes, spread
from raylog.config import TopicConfig
from raylog.errors import BrokerUnavailableError, ClosedError, RequestTimeoutError
from raylog.metadata import ConnectionSettings, Metadata

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "/tmp/raylog"
LOCAL_NODE = "local"


#: the clients made in this process and not closed yet, oldest first (see
#: current_client); appended and removed under the GIL, safe from any thread
_OPEN_CLIENTS: list = []


def current_client() -> "Client | None":
    """The client this process connected last and has not closed (what
    ``raylog.connect()`` returned), or None; used by the readers and writers
    that take an optional ``client=``."""
    return _OPEN_CLIENTS[-1] if _OPEN_CLIENTS else None


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
    ):
        from raylog.groups.registry import Registry
        from raylog.groups.zookeeper import connect_kazoo

        if token is None:
            from raylog.auth import cluster_token

            token = cluster_token(cluster)  # closed by default: see raylog.auth
        self.settings = ConnectionSettings(zookeeper=zookeeper, cluster=cluster, token=token)
        self.data_dir = data_dir
        self.data_host = data_host
        self._owned_zookeeper = _owned_zookeeper
        self._owns_ray = _owns_ray
        self._owned_data_dir = _owned_data_dir
        self._zk = connect_kazoo(zookeeper)
        self.registry = Registry(self._zk, cluster)
        self.metadata = Metadata(self.registry, self.settings)
        self._children: list = []  # producers and consumers to close with the client
        self._closed = False
        _OPEN_CLIENTS.append(self)

    # -- topics --------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, *, timeout_s: float = 120.0, **settings) -> TopicConfig:
        """Create a topic and start one partition actor per partition, spread
        over the nodes that offer local disk. Returns the topic's config.

        ``settings`` are :class:`raylog.TopicConfig` fields (retention_ms,
        retention_bytes, segment_bytes, segment_ms, flush_messages, flush_ms,
        max_message_bytes, max_inflated_bytes, max_producer_ids)."""
        import ray

        self._check_open()
        config = TopicConfig(partitions=partitions, **settings)
        nodes = ray.nodes()
        disks = disk_nodes(nodes)
        placement = spread(partitions, disks, offset=sum(name.encode()) % max(1, len(disks)))
        self.registry.create_topic(name, config)
        try:
            for p, node in enumerate(placement):
                self.registry.set_placement(name, p, node.identity, self.log_dir(name, p))
            self._serve(name, config, nodes, timeout_s)
        except BaseException:
            self._stop_actors(name, partitions, delete_data=True)
            self.registry.delete_topic(name)
            raise
        return config

    def log_dir(self, topic: str, partition: int) -> str:
        """Where a new partition's log goes on its node:
        ``<data_dir>/<cluster>/<topic>-<partition>``, so that clusters
        sharing a data directory never share a partition directory (each is
        also locked by its owner, see :mod:`raylog.storage.log`)."""
        return os.path.join(self.data_dir, self.settings.cluster, f"{topic}-{partition}")

    def ensure_served(self, name: str, timeout_s: float = 120.0) -> None:
        """Start any partition actor of ``name`` that is not running (for a
        cluster whose actors were stopped; a running actor is left alone)."""
        import ray

        self._serve(name, self.registry.topic_config(name), ray.nodes(), timeout_s)

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

    def delete_topic(self, name: str) -> None:
        """Stop the topic's partition actors, delete their logs and the topic."""
        self._check_open()
        config = self.registry.topic_config(name)
        self._stop_actors(name, config.partitions, delete_data=True)
        self.registry.delete_topic(name)

    def list_topics(self) -> list[str]:
        return self.registry.list_topics()

    def describe_topic(self, name: str) -> dict:
        """Config, and per partition: node, log directory, endpoint, log
        start offset and high watermark."""
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
        from raylog.transfer.client import BrokerConnection

        host, port = self.metadata.endpoint(topic, partition, refresh=True, wait_s=5.0)
        with BrokerConnection(host, port, token=self.settings.token, timeout_s=10) as conn:
            return conn.offsets(topic, partition)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The high watermark of every partition of ``topic``."""
        return {p: self.offsets(topic, p)[1] for p in range(self.metadata.partitions(topic))}

    # -- producers and consumers ---------------------------------------------

    def producer(self, **options):
        """A :class:`raylog.Producer` (batch_size, linger_ms, compression, acks,
        audit...)."""
        from raylog.producer import Producer

        self._check_open()
        if options.get("audit"):
            self.ensure_audit_topic()
        producer = Producer(self.metadata, **options)
        self._children.append(producer)
        return producer

    def producer_actor(self, **options):
        """A Ray actor handle wrapping a producer, for Ray apps:
        ``ray.get(handle.send_batch.remote("clicks", [b"v1", b"v2"]))``."""
        from raylog.actors.producer import producer_actor

        self._check_open()
        if options.get("audit"):
            self.ensure_audit_topic()
        return producer_actor(self.settings, **options)

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

    def describe_group(self, group: str) -> list[dict]:
        """One row per partition the group reads: owner, committed offset,
        end offset (high watermark) and lag; plus idle members."""
        from raylog.groups.admin import describe_group

        def end_offset(topic: str, partition: int) -> int | None:
            try:
                return self.offsets(topic, partition)[1]
            except (BrokerUnavailableError, RequestTimeoutError):
                return None  # shown as unknown rather than failing the whole table

        return describe_group(self._zk, self.settings.cluster, group, end_offsets=end_offset)

    # -- life cycle ----------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise ClosedError("the client is closed; call raylog.connect() again")

    def close(self) -> None:
        """Close producers and consumers made here; in the embedded default
        also stop the partition actors, Ray and ZooKeeper it started."""
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
            for topic in self.registry.list_topics():
                try:
                    self._stop_actors(topic, self.registry.topic_config(topic).partitions, delete_data=False)
                except Exception as err:  # noqa: BLE001
                    log.warning("stopping partitions of %s failed: %s", topic, err)
        self._zk.stop()
        self._zk.close()
        if self._owns_ray:
            import ray

            ray.shutdown()
        if self._owned_zookeeper is not None:
            self._owned_zookeeper.stop()
        if self._owned_data_dir is not None:
            shutil.rmtree(self._owned_data_dir, ignore_errors=True)

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
) -> Client:
    """Connect to a raylog cluster, or start the embedded default.

    - ``raylog.connect()``: local Ray + a ZooKeeper started here + logs in a
      temporary directory removed by ``close()``;
    - ``raylog.connect(data_dir="/tmp/rl")``: the same, logs kept there;
    - ``raylog.connect(zookeeper="host:2181", ray_address="auto")``: an
      existing cluster (``data_dir`` defaults to ``/tmp/raylog`` on each node).

    ``token``: the cluster's token, for a process that cannot derive it
    (outside Ray, without Ray's auth token); by default the client derives
    it (see :mod:`raylog.auth`). Every data port requires it.
    """
    import ray

    if isinstance(token, str):
        token = token.encode()
    embedded_zk = None
    owns_ray = False
    owned_data_dir = None
    try:
        if zookeeper is None:
            from raylog.groups.zookeeper import EmbeddedZooKeeper

            embedded_zk = EmbeddedZooKeeper().start()
            zookeeper = embedded_zk.connect_string
        data_host = None
        if not ray.is_initialized():
            if ray_address is None:
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
                owns_ray = True
                data_host = "127.0.0.1"
            else:
                if "RAY_AUTH_MODE" not in os.environ and os.path.exists(os.path.expanduser("~/.ray/auth_token")):
                    # A cluster started here uses token auth; a driver given an
                    # explicit address must say so to present the token.
                    os.environ["RAY_AUTH_MODE"] = "token"
                ray.init(address=ray_address, logging_level=logging.WARNING)
        elif ray_address is None and embedded_zk is not None:
            data_host = "127.0.0.1"
        if data_dir is None:
            if embedded_zk is not None and owns_ray:
                data_dir = owned_data_dir = tempfile.mkdtemp(prefix="raylog-data-")
            else:
                data_dir = DEFAULT_DATA_DIR
        return Client(
            zookeeper=zookeeper,
            cluster=cluster,
            data_dir=data_dir,
            token=token,
            data_host=data_host,
            _owned_zookeeper=embedded_zk,
            _owns_ray=owns_ray,
            _owned_data_dir=owned_data_dir,
        )
    except BaseException:
        if owns_ray:
            ray.shutdown()
        if embedded_zk is not None:
            embedded_zk.stop()
        if owned_data_dir is not None:
            shutil.rmtree(owned_data_dir, ignore_errors=True)
        raise
