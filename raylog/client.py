"""The :class:`Client`: one connection to a raylog cluster, and what it
made (producers, consumers, producer actors) and must close.

Its parts, each in a module of its own and given what it uses when the
client is made: topics and their partition actors
(:class:`~raylog.admin.topics.TopicAdmin`), partition and group offsets
(:class:`~raylog.admin.offsets.OffsetAdmin`); the client's methods of the
same names call them. :func:`raylog.connect` (:mod:`raylog.startup`)
starts the embedded default or joins a cluster and returns a client. This
module keeps the factories of producers and consumers, the audit report and
the client's life cycle.

Thread-safety: a :class:`Client` may be shared by threads; producers and
consumers it creates are documented in their own modules.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import sys
import time

from raylog.actors.producer import CLOSE_SETTLE_S, producer_actor
from raylog.actors.supervisor import stop_supervisor
from raylog.admin.offsets import OffsetAdmin
from raylog.admin.topics import TopicAdmin, for_kafka_listener
from raylog.audit import AUDIT_TOPIC, audit_report
from raylog.config import EARLIEST, TopicConfig
from raylog.consumer import Consumer
from raylog.errors import ClosedError, ConfigError, RaylogError, RequestTimeoutError, TopicExistsError
from raylog.kafka.tls import checked_tls
from raylog.metadata import OPEN_CLIENTS, ConnectionSettings, Metadata, current_client
from raylog.producer import Producer
from raylog.producer.audit_publisher import ProducerAuditPublisher
from raylog.producer.producer import EXIT_DELIVERY_DEFAULT_S, register_exit_hook, close_open_producers
from raylog.zk.registry import Registry
from raylog.zk.acl import secure_session
from raylog.zk.partition_state import read_state
from raylog.zk.errors import zookeeper_errors
from raylog.zk.session import OutageReporter, connect_kazoo

logger = logging.getLogger(__name__)



def default_data_dir() -> str:
    """Where a node keeps partition logs when no ``data_dir`` is given: in the
    user's own space, ``$XDG_DATA_HOME/raylog`` (``~/.local/share/raylog``
    when unset), never the shared ``/tmp`` (data at rest is its owner's
    only: :mod:`raylog.storage.owner_only`). Resolved by the process that creates
    topics and given to the partition actors as a path."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "raylog")


#: the default ``data_dir`` as this process resolved it at import (see :func:`default_data_dir`)
DEFAULT_DATA_DIR = default_data_dir()
#: closing a producer actor may take its delivery deadline and this much more
PRODUCER_ACTOR_CLOSE_GRACE_S = 10.0

# the clients made in this process and not closed yet: raylog.metadata keeps
# the list (below the readers that look for the current one)
_OPEN_CLIENTS = OPEN_CLIENTS


def _close_all_at_exit() -> None:
    """At interpreter exit, in this order: every producer still open
    delivers what was sent (within its delivery deadline; one warning line
    names what was not delivered, see :meth:`raylog.Producer.close_at_exit`),
    then every client not closed yet is closed, newest first, silently:
    each flushes its producer actors, closes its consumers, then (embedded
    default) stops its partition actors, ZooKeeper and Ray.

    Registered once, as a hook of the threading module's shutdown: it runs
    before the interpreter shuts its thread pools down (the producer's
    sender needs them) and before every ``atexit`` handler, among them the
    ``ray.shutdown`` that ``ray.init`` registered."""
    try:
        close_open_producers()
    except BaseException:  # noqa: BLE001 - at exit, nothing is left to tell
        pass
    if not _OPEN_CLIENTS:
        return
    for name in ("raylog", "raylog_spark", "kazoo"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    for client in reversed(list(_OPEN_CLIENTS)):
        try:
            client.close()
        except BaseException:  # noqa: BLE001 - at exit, nothing is left to tell
            pass


# after raylog.producer's own hook, so that this one runs first (latest first)
register_exit_hook(_close_all_at_exit)


def kafka_listener_placements() -> list[tuple[str, dict]]:
    """Each disk node's identity and the Ray options that pin an actor to it:
    where :mod:`raylog.kafka.launch` starts the Kafka listeners (called in
    the process or Ray task that starts them)."""
    import ray  # heavy (Ray): imported when used

    from raylog.actors.placement import disk_nodes, scheduling_options

    nodes = ray.nodes()
    return [(disk.identity, scheduling_options(disk.identity, nodes)) for disk in disk_nodes(nodes)]


def kafka_listener_topics(data_dir: str, data_host: str | None):
    """The factory of a Kafka listener's topic administration (CreateTopics,
    DeleteTopics): new partitions under ``data_dir``, served on ``data_host``."""
    return functools.partial(for_kafka_listener, data_dir=data_dir, data_host=data_host)


def kafka_listener_coordinator(zookeeper: str, cluster: str):
    """What a Kafka listener calls to start the cluster's transaction
    coordinator when a Kafka client's transactional call finds none
    running (:class:`raylog.kafka.transactions.CoordinatorLink`)."""
    from raylog.actors.transaction_coordinator import start_transaction_coordinator

    return functools.partial(start_transaction_coordinator, zookeeper, cluster)


def _in_ray_worker() -> bool:
    """Whether this process is a Ray worker (an actor or a task), not a
    driver; False where Ray was never imported."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return ray._private.worker.global_worker.mode == ray.WORKER_MODE
    except AttributeError:
        return False


class Client:
    """A connection to one raylog cluster (a ZooKeeper root and a Ray
    cluster). Topics: :class:`raylog.admin.topics.TopicAdmin`; offsets and
    groups: :class:`raylog.admin.offsets.OffsetAdmin`. ``kafka_tls``
    (:class:`raylog.TlsSettings`): the TLS its :meth:`start_kafka_listeners`
    starts the Kafka listeners with when given none."""

    def __init__(
        self,
        *,
        zookeeper: str,
        cluster: str = "default",
        data_dir: str = DEFAULT_DATA_DIR,
        token: bytes | None = None,
        data_host: str | None = None,
        kafka_tls=None,
        _owned_zookeeper=None,
        _owns_ray: bool = False,
        _owned_data_dir: str | None = None,
        _zk=None,
    ):
        # token None: the settings derive the cluster's token (raylog.auth)
        self.settings = ConnectionSettings(zookeeper=zookeeper, cluster=cluster, token=token)
        self.data_dir = data_dir
        self.data_host = data_host
        self.kafka_tls = checked_tls(kafka_tls, "kafka_tls")
        self._owned_zookeeper = _owned_zookeeper
        self._owns_ray = _owns_ray
        self._owned_data_dir = _owned_data_dir
        self._zk = _zk if _zk is not None else connect_kazoo(zookeeper, refused_fails_fast=True)
        # One line when ZooKeeper goes away and one when it is back, from
        # the driver; a client inside a Ray actor or task says nothing, as
        # the actors' own sessions do not (raylog.zk.session).
        self._outages = OutageReporter(zookeeper, logger)
        if not _in_ray_worker():
            self._zk.add_listener(self._outages)
        # a token holder's session writes the cluster's nodes, with their ACL (raylog.zk.acl)
        with zookeeper_errors(self._zk, f"authenticate to ZooKeeper for cluster {cluster!r}"):
            secure_session(self._zk, self.settings.token, cluster)
        self.registry = Registry(self._zk, cluster)
        self.metadata = Metadata(self.registry, self.settings)
        self._offset_admin = OffsetAdmin(zk=self._zk, settings=self.settings, metadata=self.metadata)
        self._topic_admin = TopicAdmin(
            zk=self._zk, registry=self.registry, settings=self.settings, data_dir=data_dir, data_host=data_host,
            check_open=self._check_open, offsets=self._offset_admin.offsets,
        )
        self._children: list = []  # producers and consumers to close with the client
        self._closed = False
        self._actors: list = []  # producer actors to stop with an embedded client
        self._actor_deadlines: list[float] = []  # their delivery deadlines, seconds
        self._kafka_nodes: list[str] = []  # nodes whose Kafka listener this client started
        _OPEN_CLIENTS.append(self)

    # -- producers and consumers ---------------------------------------------

    def producer(self, **options):
        """A :class:`raylog.Producer` (batch_size, linger_ms, compression,
        acks 0/1/"all", enable_idempotence, retry, audit...); ``send`` returns
        a future of ``(partition, offset)``; ``flush(timeout_s)`` and
        ``close(timeout_s)`` take seconds.

        ``transactional_id="..."`` (with ``transaction_timeout_ms``) makes a
        transactional producer (``begin_transaction``, ``send``,
        ``send_offsets_to_transaction``, ``commit_transaction``,
        ``abort_transaction``; acks "all", the default then): it fences
        any older producer of that id. The cluster's transaction
        coordinator is started here on first use (joins the Ray cluster)."""
        self._before_making(options)
        if options.get("transactional_id") is not None:
            options.setdefault("acks", "all")
            options.setdefault("transaction_coordinator", self.transaction_coordinator())
        producer = Producer(self.metadata, **options)
        self._children.append(producer)
        return producer

    def producer_actor(self, **options):
        """A Ray actor handle wrapping a producer, for Ray apps:
        ``ray.get(handle.send_batch.remote("clicks", [b"v1", b"v2"]))``
        returns once that call's messages are acknowledged (or raises for
        them alone)."""
        self._before_making(options)
        if options.get("transactional_id") is not None:
            options.setdefault("acks", "all")
            self.transaction_coordinator()  # the actor finds it by its name
        handle = producer_actor(self.settings, **options)
        self._actors.append(handle)
        retry = options.get("retry")
        self._actor_deadlines.append(
            retry.deadline_s if retry is not None and retry.deadline_s is not None else EXIT_DELIVERY_DEFAULT_S
        )
        return handle

    def consumer(self, topics, group: str | None = None, **options):
        """A :class:`raylog.Consumer` of ``topics`` (a name or a list);
        with ``group``, coordinated with the other members of the group.
        ``poll(timeout_ms)`` takes milliseconds, as Kafka's consumer does."""
        self._before_making(options)
        if options.get("audit"):  # the consumer's audit events go out through a producer
            options.setdefault("audit_publisher", ProducerAuditPublisher(self.metadata))
        consumer = Consumer(self.metadata, topics, group=group, **options)
        self._children.append(consumer)
        return consumer

    def _before_making(self, options: dict) -> None:
        """What every factory checks first: the client is open, and the
        audit topic exists when the new producer or consumer audits."""
        self._check_open()
        if options.get("audit"):
            self.ensure_audit_topic()

    # -- topics (raylog.admin.topics) -----------------------------------------

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
        return self._topic_admin.create_topic(name, partitions, timeout_s=timeout_s, **settings)

    def alter_topic(self, name: str, **settings) -> TopicConfig:
        """Change settings of a live topic; returns its new config.

        ``settings`` are :class:`raylog.TopicConfig` fields that may change
        while the topic serves (:data:`raylog.zk.live_config.LIVE_SETTINGS`):
        retention_ms, retention_bytes, segment_bytes, segment_ms,
        flush_messages, flush_ms, retention_check_ms, cleanup_policy,
        delete_retention_ms, min_compaction_lag_ms, max_compaction_lag_ms,
        min_cleanable_dirty_ratio, unclean_leader_election,
        replica_replace_after_s. Every partition actor of the topic takes
        them within moments, without a restart (turned to ``compact``, its
        cleaner starts and records without a key are refused from then on;
        turned back to ``delete``, the cleaner stops), and a partition
        started later takes them too.

        The new config is validated whole before it is written (with a
        versioned compare-and-set, so concurrent changes are never lost): a
        bad value or an unknown name raises :class:`raylog.ConfigError`
        naming the setting; partitions (grow them with
        :meth:`add_partitions`), replication_factor and the other settings
        fixed at creation raise ``ConfigNotLiveError`` saying why.
        Either way the stored config is unchanged. Requires the cluster's
        token."""
        return self._topic_admin.alter_topic(name, **settings)

    def add_partitions(self, name: str, total: int, *, timeout_s: float = 120.0) -> TopicConfig:
        """Grow a live topic to ``total`` partitions (Kafka's semantics: the
        new count, not the number to add); returns its new config.

        The new partitions are placed as a topic made with ``total``
        partitions would have them (same replication factor and settings as
        the topic's, log directories beside its first partition's),
        recorded in ZooKeeper in one transaction with the new count, and
        their partition actors started (waiting up to ``timeout_s`` for
        them; 0: not waiting). Clients see the new count at once:
        producers partition keys over it from then on (a watch on the
        topic's config; a send naming a new partition is accepted at once),
        consumer groups rebalance over it (range assignment), the Kafka
        listeners' Metadata names the new partitions.

        **Keys move**: a key's partition is its hash modulo the partition
        count, so after the change most keys map to other partitions than
        before; a key's older messages stay where they were written, and
        its order across the change is not kept (as in Kafka). Partitions
        are never removed.

        Raises ``InvalidPartitionsError`` (naming the count now, in its
        ``current``) for a total not larger than the topic's count or above
        ``MAX_PARTITIONS``, :class:`raylog.UnknownTopicError` for a topic
        that does not exist: nothing is changed then. Partitions whose
        actors did not start within ``timeout_s`` stay recorded (the topic
        has ``total`` partitions) and ``BrokerUnavailableError`` says so;
        :meth:`repair` or the supervisor starts them. Requires the
        cluster's token and the Ray cluster (as :meth:`create_topic`)."""
        return self._topic_admin.add_partitions(name, total, timeout_s=timeout_s)

    def delete_records(self, topic: str, offsets: dict[int, int], *, timeout_s: float = 30.0) -> dict[int, int]:
        """Delete the records of ``topic`` before the given offsets (Kafka's
        DeleteRecords): ``{partition: offset}`` in, ``{partition: new log
        start offset}`` out. Each partition's log start moves to its offset,
        inside a segment too, and is kept on disk; reads below it are out of
        range (``OffsetOutOfRangeError``, as below retention), ``earliest``
        (consumers' ``auto_offset_reset``, ``offsets``, Kafka's ListOffsets)
        answers it, counts start at it, and whole segments below it are
        deleted. An offset of -1 is the partition's high watermark
        (everything readable goes). In a segment of record batches the start
        may lie inside a batch (a reader skips the batch's records before
        it); among format 1's messages it moves to the next message
        boundary, which is what is answered. The start never moves back: an
        offset below it answers the start as it is.

        Raises :class:`raylog.UnknownTopicError` / ``UnknownPartitionError``,
        or ``OffsetOutOfRangeError`` naming the bounds for an offset past a
        partition's high watermark (or below 0 but -1): every offset is
        checked before any partition changes, so nothing is deleted then.
        On a replicated partition its leader moves the start and the
        followers take it from their next fetch. Requires the cluster's token."""
        return self._topic_admin.delete_records(topic, offsets, timeout_s)

    def delete_topic(self, name: str, timeout_s: float = 30.0) -> None:
        """Delete the topic and its logs on every node.

        The topic leaves ZooKeeper first, in one transaction with a
        tombstone per partition log; then the running partition actors stop
        and delete their logs, and logs without a running actor are removed
        by a task on their node. A log whose node is down (or, from a
        client outside Ray, every log) keeps its tombstone, which the
        cluster's supervisor honours as soon as it can, and which a
        partition actor honours before it serves that directory again."""
        self._topic_admin.delete_topic(name, timeout_s)

    def list_topics(self) -> list[str]:
        """The topics of the cluster."""
        return self._topic_admin.list_topics()

    def describe_topic(self, name: str) -> dict:
        """Config, and per partition: node (of a replicated partition: its
        leader's), log directory, whether it is served, endpoint, log start
        offset and high watermark (a partition not served has no endpoint:
        :meth:`repair` serves it again). A compacted topic's partitions also
        have ``cleaner``: the dirty ratio, whether the cleaner runs, its
        passes, bytes and records removed and its last pass's time (ms), as
        the partition's actor reports them (None outside Ray or when it did
        not answer)."""
        return self._topic_admin.describe_topic(name)

    def log_dir(self, topic: str, partition: int) -> str:
        """Where a new partition's log goes on its node:
        ``<data_dir>/<cluster>/<topic>-<partition>``, so that clusters
        sharing a data directory never share a partition directory (each is
        also locked by its owner, see :mod:`raylog.storage.log`)."""
        return self._topic_admin.log_dir(topic, partition)

    def repair(self, topic: str | None = None, timeout_s: float = 60.0) -> list[dict]:
        """Serve again every registered partition (of ``topic``, or all)
        that is not served, and remove the logs of deleted topics that are
        still on their nodes: one repair pass of the cluster's supervisor
        (:mod:`raylog.actors.supervisor`), which is started here if it does
        not run. Returns one row per partition and per pending delete:
        ``{"topic", "partition", "node", "state", "detail"}`` with state
        ``serving``, ``started``, ``starting``, ``node down``, ``removed``,
        ``pending`` or ``failed``. Joins the Ray cluster."""
        return self._topic_admin.repair(topic, timeout_s)

    def start_supervisor(self, interval_s: float | None = None, wait: bool = True, timeout_s: float = 60.0):
        """Start the cluster's supervisor unless it runs (it serves every
        registered partition again after a restart); return its handle
        (with ``wait``, once it answers, or a retriable :class:`RaylogError`
        after ``timeout_s``)."""
        return self._topic_admin.start_supervisor(interval_s, wait, timeout_s)

    def transaction_coordinator(self, timeout_s: float = 60.0):
        """The handle of the cluster's transaction coordinator
        (:mod:`raylog.actors.transaction_coordinator`), started unless it
        runs: on first use, so a cluster without transactions runs no
        coordinator; it is a detached actor that Ray restarts, and it
        finishes what an earlier incarnation left prepared. Joins the Ray
        cluster."""
        from raylog.actors.transaction_coordinator import start_transaction_coordinator

        return start_transaction_coordinator(self.settings.zookeeper, self.settings.cluster, timeout_s=timeout_s)

    def start_kafka_listeners(self, host: str | None = None, port: int = 0, timeout_s: float = 60.0,
                              tls=None, *, auto_create_topics: bool | None = None) -> list[dict]:
        """Start a Kafka protocol listener on every disk node unless one
        runs (:mod:`raylog.kafka`; docs/design.md section 10), each pinned
        to its node, on ``host`` (default: the client's ``data_host``, else
        the node's address) and ``port`` (0: a free one); over TLS only
        with ``tls`` (:class:`raylog.TlsSettings`; default the client's
        ``kafka_tls``: the certificate and key files must be at the same
        paths on every disk node; :mod:`raylog.kafka.tls`). Returns each
        listener's ``{"host", "port", "broker_id", "node",
        "security_protocol"}`` (and ``ssl_ca``, the CA certificate, over
        TLS); a Kafka client takes :meth:`kafka_config`. ConfigError when
        the TLS files cannot be used, or a listener runs already with
        another security protocol. Joins the Ray cluster.

        ``auto_create_topics``: whether the listeners create a topic that a
        Kafka client asks for and the cluster does not have (Kafka's
        ``auto.create.topics.enable``; :mod:`raylog.kafka.auto_create`):
        with one partition and the default settings of :meth:`create_topic`.
        Off when a listener starts; ``None`` leaves running listeners as
        they are, ``True``/``False`` turns it on or off on every listener."""
        import ray  # heavy, lazy on purpose

        from raylog.kafka.launch import start_all

        self._check_open()
        tls = self.kafka_tls if tls is None else checked_tls(tls, "tls")
        handles = start_all(self.settings.zookeeper, self.settings.cluster, host or self.data_host, port,
                            kafka_listener_placements, kafka_listener_topics(self.data_dir, self.data_host),
                            kafka_listener_coordinator(self.settings.zookeeper, self.settings.cluster), tls,
                            bool(auto_create_topics))
        if auto_create_topics is not None:  # listeners found running take the setting too
            ray.get([h.set_auto_create_topics.remote(bool(auto_create_topics)) for h in handles], timeout=timeout_s)
        ready, _ = ray.wait([h.entry.remote() for h in handles], num_returns=len(handles), timeout=timeout_s)
        if len(ready) < len(handles):
            raise RaylogError(f"{len(handles) - len(ready)} Kafka listener(s) did not start within {timeout_s:g} s",
                              retriable=True)
        entries = ray.get(ready)
        self._kafka_nodes.extend(e["node"] for e in entries if e["node"] not in self._kafka_nodes)
        for entry in entries:  # one that ran already keeps its settings: say so rather than ignore tls
            if str(entry.get("security_protocol", "PLAINTEXT")).endswith("SSL") != (tls is not None):
                raise ConfigError(
                    f"the Kafka listener of node {entry['node']!r} runs already with security protocol "
                    f"{entry.get('security_protocol', 'PLAINTEXT')}; close the client that started it to start it "
                    f"{'with' if tls is not None else 'without'} TLS")
        return entries

    def kafka_config(self, dialect: str = "librdkafka", mechanism: str | None = None) -> dict:
        """What a Kafka client needs to reach this cluster's listeners:
        ``bootstrap.servers``, ``security.protocol`` (``SASL_SSL`` when the
        listeners serve TLS, with ``ssl.ca.location``: a file on this
        machine holding the CA certificate they registered) and, for a
        cluster with a token, ``sasl.mechanisms`` (``mechanism``: SCRAM-SHA-256
        by default, SCRAM-SHA-512, or PLAIN over TLS only), ``sasl.username``
        (the cluster's name) and ``sasl.password`` (its token), so that
        ``confluent_kafka.Producer(client.kafka_config())`` works as it is.
        ``dialect``: the same in the names another client takes --
        ``"java"`` (``sasl.jaas.config``), ``"kafka-python"``
        (``KafkaProducer(**config)``), ``"aiokafka"``
        (:mod:`raylog.kafka.dialects`)."""
        from raylog.kafka.dialects import DIALECTS, in_dialect
        from raylog.kafka.service import kafka_config

        if dialect not in DIALECTS:  # before any wait for a listener
            in_dialect({}, dialect)
        return in_dialect(kafka_config(self._zk, self.registry.paths, self.settings.cluster, self.settings.token,
                                       mechanism=mechanism), dialect)

    def reassign_partition(self, topic: str, partition: int, replicas: list[str], timeout_s: float = 120.0):
        """Move the replicas of ``topic``-``partition`` to the disk nodes
        ``replicas`` (Kafka's kafka-reassign-partitions): new replicas start
        as followers and catch up; once all of ``replicas`` are in sync they
        become the replicas (the lead moving to one of them, with a new
        leader epoch, when the leader is not among them) and the others stop
        and their logs are removed (by the supervisor once their node is
        back, when it is down). Returns ``{"leader", "leader_epoch",
        "replicas", "isr"}``. Raises :class:`UnknownTopicError`,
        :class:`UnknownPartitionError`, :class:`InvalidReassignmentError`
        (not replicated; not distinct alive disk nodes, as many as the
        replication factor) before anything changes, and the retriable
        :class:`ReassignmentTimeoutError` when the new replicas did not catch
        up within ``timeout_s``. Joins the Ray cluster
        (:mod:`raylog.replication.reassign`)."""
        return self._topic_admin.reassign_partition(topic, partition, replicas, timeout_s)

    def hand_off(self, topic: str, partition: int, node: str, timeout_s: float = 10.0) -> dict:
        """Move the lead of replicated ``topic``-``partition`` to its in-sync
        replica on ``node`` by a handoff, not a failover (docs/design.md
        section 7, :mod:`raylog.replication.handoff`): the leader stops
        accepting, ``node`` catches up to its log end, the lead switches with
        a new leader epoch and producers and readers are redirected. Returns
        ``{"leader", "leader_epoch", "log_end", "leaderless_s", ...}``.
        Raises the retriable :class:`HandoffError` (nothing changed) when
        ``node`` is not in sync or does not catch up within ``timeout_s``.
        Joins the Ray cluster."""
        return self._topic_admin.hand_off(topic, partition, node, timeout_s)

    def drain_node(self, node: str, timeout_s: float = 60.0) -> dict:
        """Prepare disk node ``node`` to stop (Kafka's controlled shutdown,
        :mod:`raylog.replication.drain`): every partition it leads is handed
        to an in-sync replica elsewhere, then every leader takes it out of
        its ISR until it restarts. Returns ``{"node", "can_stop",
        "leaders_moved", "followers_shed", "blocked",
        "longest_leaderless_s"}``; ``can_stop`` is true when the node leads
        nothing and is in no ISR, else ``blocked`` says why. Joins the Ray
        cluster."""
        return self._topic_admin.drain_node(str(node), timeout_s)

    def rolling_restart(self, nodes: list[str] | None = None, restart=None, timeout_s: float = 300.0,
                        on_step=None) -> list[dict]:
        """Restart the disk nodes one at a time without downtime
        (:mod:`raylog.actors.rolling`): drain one, restart it (by default its
        raylog actors, in new processes; ``restart(node)`` to restart more,
        say its Ray node), wait until its replicas are all in sync again,
        then the next. One row per node; raises the retriable
        :class:`RollingRestartError` when a node cannot
        be drained or does not come back whole within ``timeout_s``. Joins
        the Ray cluster."""
        return self._topic_admin.rolling_restart(nodes, restart, timeout_s, on_step)

    def balance_leaders(self, topics: list[str] | None = None, timeout_s: float = 10.0) -> dict:
        """Hand every partition's lead back to its preferred replica (the
        first of its replicas) where that one runs and is in sync
        (:mod:`raylog.replication.preferred`). Returns ``{"moved", "failed",
        "leaders_before", "leaders_after"}`` (the last two: node -> number
        of partitions led). Joins the Ray cluster."""
        return self._topic_admin.balance_leaders(topics, timeout_s)

    def partition_actor(self, topic: str, partition: int):
        """The Ray actor handle of a partition (for control calls and tests)."""
        return self._topic_admin.partition_actor(topic, partition)

    def replication_state(self, topic: str, partition: int):
        """The partition's replication state as ZooKeeper holds it now (a
        :class:`~raylog.zk.partition_state.PartitionState`: ``leader``,
        ``leader_epoch``, ``isr``, ``replicas``, ``origin``), read without
        asking any replica; None for a partition of one replica."""
        self._check_open()
        found = read_state(self._zk, self.registry.paths, topic, partition)
        return None if found is None else found[0]

    def leader_actor(self, topic: str, partition: int):
        """The Ray actor handle of the replica that leads the partition now
        (of a partition of one replica: its actor). Raises
        :class:`BrokerUnavailableError` when none runs, e.g. during a failover."""
        return self._topic_admin.leader_actor(topic, partition)

    def _actor(self, topic: str, partition: int):
        """The partition's actor handle, or None when none runs."""
        return self._topic_admin._actor(topic, partition)

    # -- offsets and groups (raylog.admin.offsets) -------------------------------

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """``(log start offset, high watermark)`` of a partition."""
        return self._offset_admin.offsets(topic, partition)

    def offsets_for_times(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """``{partition: offset}``: in every partition of ``topic``, the offset
        of the first message whose timestamp is at or after ``timestamp_ms``
        (ms since the epoch), or the high watermark when there is none
        (OFFSETS_FOR_TIME, backed by the segments' time indexes). A message
        inside a compressed set is found as its wrapper's offset."""
        return self._offset_admin.offsets_for_times(topic, timestamp_ms)

    def count_messages(self, topic: str, partition: int, start: int, end: int | None = None,
                       max_walk_bytes: int = 256 * 1024 * 1024) -> int | None:
        """How many messages a read of ``[start, end)`` of the partition
        returns (``end``: default the high watermark), counted on the
        partition's node (COUNT: each message's CRC checked, only the number
        sent); ``start`` may be a message's offset or a committed one, inside
        a compressed set too. ``None`` when more than ``max_walk_bytes`` of
        log lie between them (the count stops there): lag in messages is
        then a large number better read as bytes."""
        return self._offset_admin.count_messages(topic, partition, start, end, max_walk_bytes)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The high watermark of every partition of ``topic``."""
        return self._offset_admin.end_offsets(topic)

    def list_groups(self) -> list[str]:
        """Consumer groups with live members or committed offsets."""
        return self._offset_admin.list_groups()

    def describe_group(self, group: str, timeout_s: float = 5.0) -> list[dict]:
        """One row per partition the group reads: owner, committed offset,
        end offset (high watermark), ``lag_bytes``, ``lag_messages``
        (counted by the partition, from its segments' record counts) and
        ``lag_messages_estimate`` (an estimate, from the mean size of the
        messages at the committed offset); plus idle members. Partitions are
        asked concurrently within one overall ``timeout_s``; one that does
        not answer shows None. See :func:`raylog.groups.admin.describe_group`."""
        return self._offset_admin.describe_group(group, timeout_s)

    def delete_group(self, group: str) -> None:
        """Delete a consumer group's committed offsets. Refused with
        :class:`raylog.GroupActiveError` while it has live members."""
        self._offset_admin.delete_group(group)

    def delete_group_offsets(self, group: str, partitions) -> list[tuple[str, int]]:
        """Delete a consumer group's committed offsets of ``partitions``
        (``{(topic, partition), ...}``; Kafka's OffsetDelete): a consumer of
        the group then starts those partitions from its ``auto_offset_reset``.
        Returns the pairs that had an offset. Refused as a whole with
        :class:`raylog.GroupActiveError` (nothing deleted) when a live
        member reads one of the topics named; :class:`raylog.UnknownGroupError`
        for a group with neither members nor committed offsets."""
        return self._offset_admin.delete_group_offsets(group, partitions)

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
        return self._offset_admin.reset_offsets(group, topic, to, offset=offset, timestamp_ms=timestamp_ms,
                                                partitions=partitions, dry_run=dry_run)

    # -- mirroring (raylog.mirror) ---------------------------------------------

    def mirror(self, *, source_zookeeper: str, source_cluster: str, topics: str, source_token=None,
               rename: str = "{topic}", members: int = 1, name: str | None = None, **options):
        """Mirror the source topics matching ``topics`` (a regular expression
        over whole names) into this cluster (docs/design.md section 9,
        docs/mirroring.md): Ray actors here, members of a consumer group on
        the source, reached through its ZooKeeper alone. Target topics are
        named by ``rename`` (``{source}``, ``{topic}``) and made with the
        source's partition count and settings. Returns a handle with
        ``status()`` and ``stop()``. Raises :class:`MirrorSourceError`,
        :class:`MirrorNoTopicsError`, :class:`MirrorTopicMismatchError` before
        anything is created. Joins the Ray cluster."""
        from raylog.mirror.handle import start_mirror
        from raylog.mirror.spec import MirrorSpec

        self._check_open()
        if isinstance(source_token, str):
            source_token = source_token.encode()
        spec = MirrorSpec(name=name or f"{source_cluster}-mirror", source_zookeeper=source_zookeeper,
                          source_cluster=source_cluster, topics=topics, rename=rename, members=int(members),
                          source_token=source_token, **options)
        return start_mirror(self, spec)

    # -- the table view (raylog.read.table) -------------------------------------

    def read_table(self, topic: str, ending_offsets="latest", **options):
        """The latest value of each key of ``topic``, tombstones removed, as a
        ``ray.data.Dataset`` with the columns of ``raylog.read.read_raylog``:
        the state a changelog (a compacted topic) holds, in one call, right
        before and after its log cleaner ran (:func:`raylog.read.read_table`,
        whose keywords ``options`` are; one read task per partition). Joins
        the Ray cluster."""
        from raylog.read.table import read_table  # heavy (Arrow, Ray Data): imported when used

        self._check_open()
        return read_table(topic, ending_offsets, client=self, **options)

    # -- consumer pools (raylog.pool) ------------------------------------------

    def consumer_pool(self, topics, group: str, handler, **options):
        """A consumer group as a pool of Ray actors that grows and shrinks
        with its lag: each member actor is a member of ``group`` and calls
        ``handler(batch)`` (a list of :class:`raylog.Message` of one
        partition, in order) on each polled batch; ``handler`` is a
        function, or a class with ``__call__`` and optional ``setup()`` /
        ``teardown()``, made once in each member. A member commits only the
        positions its handler returned from (at least once, in order per
        partition; exactly once with ``output_topic`` and ``exactly_once``).

        Options (each a field of :class:`raylog.pool.spec.PoolSpec`):
        ``min_members=1``, ``max_members`` (default: the topics' partition
        count), ``target_lag_s=5.0``, ``batch_max=10_000``, ``resources``
        (Ray options of a member: ``num_cpus`` (default 1), ``num_gpus``,
        ``memory``, ``resources``), ``max_handler_failures=5`` (then the
        partition stops, with its error in ``status()``; or, with
        ``dead_letter_topic="name"`` (an existing topic), the failed batch
        is stored there and the partition goes on), ``output_topic="name"``
        (an existing topic, not one of ``topics``: what the handler returns
        is produced there: ``None`` or a list of ``bytes`` values,
        ``(key, value)`` pairs or messages (:class:`raylog.Message`); at least once,
        the outputs stored before the input position moves),
        ``exactly_once=False`` (True, with ``output_topic``: each batch's
        outputs and its input position are committed in one transaction, the
        inputs read ``read_committed``; one transactional producer per input
        partition, its id made of the group and the partition, as Kafka
        Streams' EOS v1, so a partition's new owner fences its previous one;
        ``transaction_timeout_ms=60_000``; see :mod:`raylog.pool.output`),
        ``autoscale=True``,
        the autoscaler's ``scale_up_after_s``, ``scale_down_after_s``,
        ``low_lag_s``, ``cooldown_s``, ``scale_step``, and the rest listed
        there. Everything is checked before anything starts
        (:class:`raylog.ConfigError`, naming any unknown option;
        :class:`raylog.UnknownTopicError`; :class:`raylog.PoolExistsError`).

        Returns a :class:`raylog.pool.PoolHandle` (``status()``,
        ``scale(n)``, ``stop(drain=True)``), stopped with a drain when the
        client closes. Joins the Ray cluster."""
        from raylog.pool import start_pool

        self._check_open()
        handle = start_pool(self, topics, group, handler, options)
        self._children.append(handle)
        return handle

    # -- audit ---------------------------------------------------------------

    def ensure_audit_topic(self) -> None:
        """Create the audit topic (one partition) unless it exists."""
        if not self.registry.topic_exists(AUDIT_TOPIC):
            try:
                self.create_topic(AUDIT_TOPIC, partitions=1, flush_ms=100)
            except TopicExistsError:
                pass

    def audit(self, topic: str | None = None, group: str | None = None, timeout_s: float = 30.0) -> list[dict]:
        """Produced vs consumed per time window, from the audit topic; rows
        whose ``short`` list is non-empty name the groups that fell short."""
        import ray  # heavy, lazy on purpose

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
        consumer = Consumer(self.metadata, AUDIT_TOPIC, auto_offset_reset=EARLIEST)
        try:
            deadline = time.monotonic() + timeout_s
            while (consumer.position(AUDIT_TOPIC, 0) or 0) < end:
                if time.monotonic() > deadline:
                    raise RequestTimeoutError(f"could not read the audit topic to offset {end} in {timeout_s} s")
                events.extend(m.value for m in consumer.poll(timeout_ms=500))
        finally:
            consumer.close()
        return audit_report(events, topic=topic, group=group)

    # -- life cycle ----------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise ClosedError("the client is closed; call raylog.connect() again")

    def close(self) -> None:
        """Close, in this order, the producers made here (each delivers
        what was sent), flush the producer actors, close the consumers; in
        the embedded default then stop the partition actors and producer
        actors, ZooKeeper, and Ray. Idempotent; also runs at interpreter
        exit for a client not closed (see :func:`_close_all_at_exit`)."""
        if self._closed:
            return
        self._closed = True
        self._outages.close()
        if self in _OPEN_CLIENTS:
            _OPEN_CLIENTS.remove(self)
        # producers first (they deliver what was sent), then the producer
        # actors, then consumers; the cluster after them
        producers = [c for c in self._children if isinstance(c, Producer)]
        others = [c for c in self._children if not isinstance(c, Producer)]
        for child in reversed(producers):
            self._close_child(child)
        self._close_producer_actors()
        for child in reversed(others):
            self._close_child(child)
        self._stop_kafka_listeners()
        if self._owns_ray:
            try:
                stop_supervisor(self.settings.cluster)  # first: it would serve them again
            except Exception as err:  # noqa: BLE001
                logger.warning("stopping the supervisor failed: %s", err)
            try:
                from raylog.actors.transaction_coordinator import stop_transaction_coordinator

                stop_transaction_coordinator(self.settings.cluster)
            except Exception as err:  # noqa: BLE001
                logger.warning("stopping the transaction coordinator failed: %s", err)
            self._stop_all_actors()
        try:
            self._zk.stop()
            self._zk.close()
        except Exception as err:  # noqa: BLE001 - closing goes on
            logger.warning("closing the ZooKeeper session failed: %s", err)
        if self._owned_zookeeper is not None:
            self._owned_zookeeper.stop()
        if self._owns_ray:
            import ray  # heavy, lazy on purpose

            ray.shutdown()
        if self._owned_data_dir is not None:
            shutil.rmtree(self._owned_data_dir, ignore_errors=True)

    def _stop_kafka_listeners(self) -> None:
        """The Kafka listeners this client started stop with it."""
        if not self._kafka_nodes:
            return
        from raylog.kafka.service import stop_listener

        for node in self._kafka_nodes:
            try:
                stop_listener(self.settings.cluster, node)
            except Exception as err:  # noqa: BLE001
                logger.warning("stopping the Kafka listener of %s failed: %s", node, err)
        self._kafka_nodes = []

    @staticmethod
    def _close_child(child) -> None:
        try:
            child.close()
        except Exception as err:  # noqa: BLE001
            logger.warning("closing %s failed: %s", type(child).__name__, err)

    def _close_producer_actors(self) -> None:
        """Each producer actor made here delivers what it was sent (a
        flush, waiting at most its delivery deadline and a little more);
        the embedded default stops them afterwards."""
        if not self._actors:
            return
        import ray  # heavy, lazy on purpose

        refs = [handle.flush.remote(deadline, CLOSE_SETTLE_S) for handle, deadline in zip(self._actors, self._actor_deadlines)]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=max(self._actor_deadlines) + PRODUCER_ACTOR_CLOSE_GRACE_S)

    def _stop_all_actors(self) -> None:
        """The partition actors of every topic (logs kept), then the
        producer actors made here: nothing in Ray holds a ZooKeeper session
        when ZooKeeper stops."""
        import ray  # heavy, lazy on purpose

        try:
            topics = self.registry.list_topics()
        except Exception as err:  # noqa: BLE001 - ZooKeeper gone: the actors end with Ray
            logger.warning("stopping the partition actors: the topics could not be listed (%s); they stop with Ray",
                           err)
            topics = []
        for topic in topics:
            try:
                self._topic_admin._stop_actors(topic, self.registry.topic_config(topic).partitions, delete_data=False)
            except Exception as err:  # noqa: BLE001
                logger.warning("stopping partitions of %s failed: %s", topic, err)
        handles, self._actors = self._actors, []
        for handle in handles:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

