"""The Kafka listener actor: one per disk node, pinned there like the
partition actors (the caller passes the pinning options; see
:meth:`raylog.Client.start_kafka_listeners`).

The actor (named ``<cluster>/kafka/<node identity>`` in the ``raylog``
namespace, detached, no CPU; Ray restarts it if its process dies, and it
registers again, on the port it bound before when that is free) derives the cluster's token itself (it runs
inside Ray, :mod:`raylog.auth`), opens its own ZooKeeper session, serves a
:class:`~raylog.kafka.listener.KafkaServer` and registers it under
``kafka/listeners/<node identity>`` (:mod:`raylog.kafka.brokers`). With a
token, clients authenticate with SCRAM-SHA-512 or -256 (user: the cluster's
name, password: the token; PLAIN too over TLS); without one (a cluster
opened on purpose) they need not. Given :class:`~raylog.kafka.tls.TlsSettings`
it serves TLS only (:mod:`raylog.kafka.tls`) and registers ``SASL_SSL`` (or
``SSL``) and the CA certificate with its endpoint.

A thread of the actor checks every :data:`REGISTRATION_CHECK_S` that the
registration is there and makes it again when it is not (a ZooKeeper
session that expired takes its ephemeral node with it).

Thread-safety: the actor's methods only read what ``__init__`` built,
except :meth:`KafkaListenerActor.stop`.
"""

from __future__ import annotations

import logging
import os
import threading

from raylog.config import NAMESPACE
from raylog.kafka import brokers
from raylog.kafka.handlers import Backend
from raylog.kafka.listener import KafkaServer
from raylog.kafka.sasl import MECHANISM, MECHANISMS, PLAIN, ScramVerifier
from raylog.kafka.tls import ca_file, ca_pem, server_context

log = logging.getLogger(__name__)

#: how often a listener checks that its registration is there (and makes it again when not)
REGISTRATION_CHECK_S = 2.0


def listener_name(cluster: str, identity: str) -> str:
    return f"{cluster}/kafka/{identity}"


class KafkaListenerActor:
    """Serves the Kafka protocol on ``host:port`` of its node (``port`` 0:
    a free one; ``host`` None: the node's address); over TLS only with
    ``tls`` (:class:`~raylog.kafka.tls.TlsSettings`)."""

    def __init__(self, zookeeper: str, cluster: str, identity: str, host: str | None = None, port: int = 0,
                 topics=None, coordinator=None, tls=None, auto_create_topics: bool = False):
        from raylog.metadata import ConnectionSettings, Metadata

        if host is None:
            import ray  # heavy (Ray): imported when used

            host = ray.util.get_node_ip_address()
        # the TLS files first: ConfigError before any session is opened
        context = None if tls is None else server_context(tls)
        ca = None if tls is None else ca_pem(tls)
        settings = ConnectionSettings(zookeeper=zookeeper, cluster=cluster)
        self._metadata = Metadata.connect(settings)
        verifier = ScramVerifier(cluster, settings.token) if settings.token is not None else None
        backend = Backend(self._metadata, verifier, None)
        backend.tls = context is not None
        security = {"security_protocol": ("SASL_" if verifier is not None else "")
                    + ("SSL" if context is not None else "PLAINTEXT")}
        if ca is not None:
            security["ssl_ca"] = ca
        if topics is not None:  # raylog's topic administration, for CreateTopics / DeleteTopics
            backend.topics = topics(self._metadata)
        if coordinator is not None:  # the transaction coordinator started on a transactional client's first call
            backend.transactions.start = coordinator
        self._backend = backend
        self.set_auto_create_topics(auto_create_topics)
        self._server = _bind(backend, host, port, brokers.remembered_port(self._metadata.zk,
                                                                          self._metadata.registry.paths, identity),
                             context)
        brokers.remember_port(self._metadata.zk, self._metadata.registry.paths, identity, self._server.port)
        self.identity = identity
        backend.entry = brokers.register(self._metadata.zk, self._metadata.registry.paths, identity, host,
                                         self._server.port, security)
        self._entry = backend.entry
        self._security = security
        self._closed = threading.Event()
        self._keeper = threading.Thread(target=self._keep_registered, name="kafka-registration", daemon=True)
        self._keeper.start()
        log.info("Kafka listener of %s on %s:%s", identity, host, self._server.port)

    def _keep_registered(self) -> None:
        """Register again when the registration is gone (its ZooKeeper session
        expired, or ZooKeeper was away): checked every :data:`REGISTRATION_CHECK_S`."""
        zk, paths = self._metadata.zk, self._metadata.registry.paths
        while not self._closed.wait(REGISTRATION_CHECK_S):
            try:
                if zk.exists(paths.kafka_listener(self.identity)) is None:
                    brokers.register(zk, paths, self.identity, self._entry["host"], self._entry["port"],
                                     self._security)
                    log.info("Kafka listener of %s registered again", self.identity)
            except Exception as err:  # noqa: BLE001 - ZooKeeper away: tried again at the next check
                log.debug("Kafka listener of %s: registration check failed: %s", self.identity, err)

    def set_auto_create_topics(self, enabled: bool) -> bool:
        """Turn creation of topics on a client's Metadata request on or off
        (:mod:`raylog.kafka.auto_create`; it needs the topic administration
        this listener was started with). Returns whether it is on."""
        backend = self._backend
        if enabled and backend.topics is not None:
            if backend.auto_create is None:
                from raylog.kafka.auto_create import AutoCreation

                backend.auto_create = AutoCreation(backend.topics)
        elif backend.auto_create is not None:
            backend.auto_create.close()
            backend.auto_create = None
        return backend.auto_create is not None

    def entry(self) -> dict:
        """``{"host", "port", "broker_id", "node", "security_protocol"}`` (and
        ``ssl_ca``) as registered."""
        return dict(self._entry)

    def stats(self) -> dict:
        """The server's connection counters (:meth:`KafkaServer.stats`), the
        registry entry and ``pid`` (the process the listener serves in)."""
        created = 0 if self._backend.auto_create is None else self._backend.auto_create.created
        return {**self._server.stats(), **self._entry, "pid": os.getpid(),
                "auto_create_topics": self._backend.auto_create is not None, "topics_auto_created": created}

    def stop(self) -> None:
        self._closed.set()
        self.set_auto_create_topics(False)
        self._keeper.join(timeout=REGISTRATION_CHECK_S + 10.0)
        self._server.close()
        self._server.backend.coordinator.close()
        self._server.wait_served()
        try:
            brokers.unregister(self._metadata.zk, self._metadata.registry.paths, self.identity)
        finally:
            self._metadata.close()


def _bind(backend, host: str, port: int, remembered: int, tls=None) -> KafkaServer:
    """The server on ``port``; with ``port`` 0 on the port bound before when
    it is free (``remembered``), else on a free one. ``tls``: its
    :class:`ssl.SSLContext` (None: plaintext)."""
    if port == 0 and remembered > 0:
        try:
            return KafkaServer(backend, host, remembered, tls=tls)
        except OSError as err:
            log.warning("Kafka listener: port %d of the last start is taken (%s); a new one is bound",
                        remembered, err)
    return KafkaServer(backend, host, port, tls=tls)


def start_listener(settings, identity: str, host: str | None, port: int, options: dict, topics=None,
                   coordinator=None, tls=None, auto_create_topics: bool = False):
    """Start (or find) the listener actor of node ``identity``; returns its handle.
    ``topics(metadata)`` makes the topic administration CreateTopics and
    DeleteTopics use (:mod:`raylog.kafka.admin`); None: they are refused.
    ``coordinator()`` starts the cluster's transaction coordinator and
    returns its handle, called when a Kafka client's transactional call
    finds none running; None: such a call is told to retry. ``tls``:
    :class:`~raylog.kafka.tls.TlsSettings` (None: plaintext).
    ``auto_create_topics``: a new listener creates topics a client asks
    for (:mod:`raylog.kafka.auto_create`); one found running keeps its
    setting (:meth:`KafkaListenerActor.set_auto_create_topics` changes it)."""
    import ray  # heavy (Ray): imported when used

    return (
        ray.remote(num_cpus=0, max_concurrency=4, max_restarts=-1)(KafkaListenerActor)
        .options(name=listener_name(settings.cluster, identity), namespace=NAMESPACE, lifetime="detached",
                 get_if_exists=True, **options)
        .remote(settings.zookeeper, settings.cluster, identity, host, port, topics, coordinator, tls,
                auto_create_topics)
    )


def stop_listener(cluster: str, identity: str, timeout_s: float = 10.0) -> bool:
    """Stop the listener of node ``identity`` (True if one ran)."""
    import ray  # heavy (Ray): imported when used

    try:
        actor = ray.get_actor(listener_name(cluster, identity), namespace=NAMESPACE)
    except ValueError:
        return False
    try:
        ray.get(actor.stop.remote(), timeout=timeout_s)
    except Exception as err:  # noqa: BLE001 - it is killed just below anyway
        log.warning("stopping the Kafka listener of %s: %s", identity, err)
    ray.kill(actor, no_restart=True)
    return True


#: how long kafka_config waits for a listener to be registered: the embedded
#: default's are started by a Ray task (a worker process, then an actor's)
KAFKA_CONFIG_WAIT_S = 60.0


def kafka_config(zk, paths, cluster: str, token: bytes | None, wait_s: float = KAFKA_CONFIG_WAIT_S,
                 mechanism: str | None = None) -> dict:
    """The settings a Kafka client needs (librdkafka's names). Waits up to
    ``wait_s`` for a listener to be registered (one starting or restarting).

    The security protocol is the one the listeners registered
    (``SASL_PLAINTEXT``, ``SASL_SSL``; without a token ``PLAINTEXT`` or
    ``SSL``); over TLS ``ssl.ca.location`` names a file of this machine
    holding the CA certificate they registered (:func:`raylog.kafka.tls.ca_file`),
    if they registered one. ``mechanism``: the SASL mechanism
    (``SCRAM-SHA-256``, the default, ``SCRAM-SHA-512``, or ``PLAIN`` on TLS
    listeners only); ConfigError for another, and when the listeners
    registered different security protocols."""
    from raylog.errors import BrokerUnavailableError, ConfigError
    from raylog.retry import RetryPolicy

    mechanism = MECHANISM if mechanism is None else mechanism
    if mechanism not in (*MECHANISMS, PLAIN):
        raise ConfigError(f"mechanism must be one of {', '.join(repr(m) for m in (*MECHANISMS, PLAIN))}, "
                          f"got {mechanism!r}")
    backoff = RetryPolicy.until(wait_s, delay_s=0.1, max_delay_s=0.5, jitter=0.0).start()
    found = brokers.listeners(zk, paths)
    while not found and backoff.wait():
        found = brokers.listeners(zk, paths)
    if not found:
        raise BrokerUnavailableError(
            f"cluster {cluster!r} has no Kafka listener running after {wait_s:g} s; start them with "
            f"client.start_kafka_listeners()")
    config = {"bootstrap.servers": ",".join(f"{e['host']}:{e['port']}" for e in found.values())}
    tls = {str(e.get("security_protocol", "PLAINTEXT")).endswith("SSL") for e in found.values()}
    cas = {e.get("ssl_ca") for e in found.values()}
    if len(tls) > 1 or len(cas) > 1:
        said = ", ".join(f"{node}: {e.get('security_protocol', 'PLAINTEXT')}" for node, e in found.items())
        raise ConfigError(f"the Kafka listeners of cluster {cluster!r} disagree on TLS or its CA ({said}); start "
                          f"them all with the same tls settings")
    tls, ca = tls.pop(), cas.pop()
    config["security.protocol"] = ("SASL_" if token is not None else "") + ("SSL" if tls else "PLAINTEXT")
    if tls and ca is not None:
        config["ssl.ca.location"] = ca_file(ca)
    if token is None:
        return config
    if mechanism == PLAIN and not tls:
        raise ConfigError("SASL PLAIN sends the token itself: it is served on TLS listeners only; these listen "
                          "without TLS (start them with tls=TlsSettings(...))")
    config.update({
        "sasl.mechanisms": mechanism,
        "sasl.username": cluster,
        "sasl.password": token.decode("ascii"),
    })
    return config
