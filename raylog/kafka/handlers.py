"""The Kafka API handlers of one client connection.

A :class:`Session` takes request frames (payload without the size field)
and returns response frames. It authenticates the connection (SASL
handshake then SaslAuthenticate with SCRAM-SHA-512 or -256, and PLAIN on a
TLS listener (:mod:`raylog.kafka.sasl`), or after a handshake of
version 0 the SCRAM tokens as bare size-prefixed frames; until then every API
but ApiVersions, SaslHandshake and SaslAuthenticate closes the connection,
as a Kafka broker does), and serves Produce, Fetch, ListOffsets and
Metadata by forwarding to each partition's data endpoint through raylog's
own data channel (:class:`raylog.transfer.connection.BrokerConnection`);
FindCoordinator, OffsetCommit and OffsetFetch through
:mod:`raylog.kafka.group_offsets` (FindCoordinator for a transactional id,
InitProducerId with one, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
TxnOffsetCommit through :mod:`raylog.kafka.transactions`); JoinGroup, SyncGroup, Heartbeat and
LeaveGroup through the listener's :mod:`raylog.kafka.coordinator`; ListGroups, DescribeGroups,
DeleteGroups and OffsetDelete through :mod:`raylog.kafka.group_admin`.

Offsets (docs/design.md section 10): a Kafka offset is the raylog offset;
ListOffsets' latest is the offset after the last record, where a consumer
that has read everything stands (:meth:`Session._records_end`).
Stored format-2 batches go to a Fetch as they are (the client skips the
records of the first batch before its offset; a batch that holds no record
at or after it is not sent, the reply starts at the next one): from a
partition on this machine straight from its segment file by ``sendfile``
(:meth:`Session._locate`, :mod:`raylog.kafka.file_ranges`), from one
elsewhere through the data channel. In format 1,
a fetch from an offset inside a compressed wrapper returns the wrapper's
records from that offset on; one inside a plain message (which holds no
record at or after it) starts at the next message. Produce stores the
client's batches as they came (:func:`raylog.kafka.records.to_stored`).

Thread-safety: a Session is confined to its connection's thread; the
:class:`Backend` it shares with the other sessions is thread-safe.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from kafka.protocol.consumer import ListOffsetsResponse
from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from raylog.errors import (
    BrokerUnavailableError,
    CorruptMessageError,
    DiskFullError,
    FrameTooLargeError,
    InvalidMessageError,
    InvalidOffsetError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    MessageTooLargeError,
    NotEnoughReplicasError,
    NotOwnerError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    ProtocolError,
    RaylogError,
    RequestTimeoutError,
    StorageError,
    UnknownPartitionError,
    UnknownTopicError,
)
from raylog.kafka import admin, brokers, group_admin, group_offsets, idempotence, transaction_admin, transactions
from raylog.kafka.coordinator import Coordinator
from raylog.kafka.frames import (
    SIZE,
    SUPPORTED,
    UNSUPPORTED_VERSION,
    BadFrame,
    advertised_versions,
    api_versions_response,
    decode_request,
    encode_response,
    peek_header,
)
from raylog.kafka.fetch_wire import encode_fetch_response
from raylog.kafka.file_ranges import FileRange, open_located
from raylog.kafka.produce_wire import decode_produce, encode_produce_response
from raylog.kafka.records import RecordsRefused, encode_batch, stored_batches, to_stored
from raylog.kafka.sasl import MECHANISMS, PLAIN, SaslFailed
from raylog.storage.decoding import decode_messages
from raylog.storage.record_batch import format_at, iter_batches
from raylog.transfer.protocol import LOCATED_BATCHES, NO_PRODUCER_ID, NO_SEQUENCE, READ_COMMITTED

log = logging.getLogger(__name__)

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 17, 18, 36
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, CREATE_PARTITIONS = 19, 20, 32, 37
ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 33, 44
DELETE_RECORDS = 21
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 15, 16, 42, 47
DESCRIBE_CLUSTER, DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 60, 61, 65, 66
_BEFORE_AUTH = {API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE}

# Kafka error codes
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
NOT_ENOUGH_REPLICAS = 19
INVALID_REQUIRED_ACKS = 21
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
INVALID_RECORD = 87
MISMATCHED_ENDPOINT_TYPE = 114
UNKNOWN_SERVER_ERROR = -1

#: DescribeCluster's authorized operations (the bits set, as kafka-python's
#: schema takes them): None is Kafka's "not asked for" (bit 31 alone); else the
#: operations of the cluster resource (AclOperation: CREATE 5, ALTER 7,
#: DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12)
NO_OPERATIONS = None
CLUSTER_OPERATIONS = frozenset((5, 7, 8, 9, 10, 11, 12))

#: the longest single long poll on one partition while others wait too
_POLL_SLICE_MS = 100
#: how many times a fetch skips past messages holding no record it wants
_SKIPS = 4
#: how long a read made ahead may wait for the fetch that wants it (see Session.after_reply)
READ_AHEAD_TTL_S = 1.0
#: the most partitions a connection remembers the inflation of (see Session._read)
_MAX_EXPANSIONS = 10_000
#: what a partition's first fetch on a connection assumes its stored bytes inflate by
_FIRST_EXPANSION = 16.0
#: how long a connection reads a partition whose bytes LOCATE did not place in a
#: segment file (format-1 messages, a log in memory) through the data channel
#: before it asks LOCATE again (see Session._locate)
_NOT_LOCATABLE_S = 10.0


def error_code(err: Exception) -> int:
    """The Kafka error code for a raylog error. One with no Kafka
    counterpart is answered by what a Kafka client should do with it: an
    error that asks for fresh metadata as NOT_LEADER_OR_FOLLOWER (the client
    looks the leader up again and retries), another retriable one as
    REQUEST_TIMED_OUT (the client retries), the rest UNKNOWN_SERVER_ERROR
    (the client gives the messages up): a client must never give up on an
    error that raylog's own producer would retry."""
    for kind, code in (
        (OffsetOutOfRangeError, OFFSET_OUT_OF_RANGE),
        (UnknownTopicError, UNKNOWN_TOPIC_OR_PARTITION),
        (UnknownPartitionError, UNKNOWN_TOPIC_OR_PARTITION),
        (NotOwnerError, NOT_LEADER_OR_FOLLOWER),
        (BrokerUnavailableError, NOT_LEADER_OR_FOLLOWER),
        (RequestTimeoutError, REQUEST_TIMED_OUT),
        (NotEnoughReplicasError, NOT_ENOUGH_REPLICAS),
        (MessageTooLargeError, MESSAGE_TOO_LARGE),
        (FrameTooLargeError, MESSAGE_TOO_LARGE),
        (CorruptMessageError, CORRUPT_MESSAGE),
        (InvalidMessageError, INVALID_RECORD),
        (DiskFullError, KAFKA_STORAGE_ERROR),
        # a transactional batch of a fenced producer or outside its transaction
        (InvalidProducerEpochError, INVALID_PRODUCER_EPOCH),
        (ProducerFencedError, INVALID_PRODUCER_EPOCH),
        (InvalidTxnStateError, INVALID_TXN_STATE),
    ):
        if isinstance(err, kind):
            return code
    if isinstance(err, StorageError) and err.retriable:
        return KAFKA_STORAGE_ERROR
    if getattr(err, "refresh_metadata", False):
        return NOT_LEADER_OR_FOLLOWER
    if getattr(err, "retriable", False):
        return REQUEST_TIMED_OUT
    return UNKNOWN_SERVER_ERROR


class Backend:
    """What every session of one listener shares: the cluster's metadata
    (:class:`raylog.metadata.Metadata`, thread-safe), its connection
    settings, the SCRAM verifier (None: no token, no authentication),
    this listener's own registry entry and the counts of the record bytes
    its Fetch responses carried (thread-safe: one lock)."""

    def __init__(self, metadata, verifier, entry: dict):
        from raylog.groups.offsets import OffsetStore

        self.metadata = metadata
        self.offsets = OffsetStore(metadata.zk, metadata.settings.cluster)
        self.settings = metadata.settings
        self.verifier = verifier
        self.entry = entry
        #: whether the listener serves TLS (its connections may use SASL PLAIN)
        self.tls = False
        #: raylog's topic administration for CreateTopics / DeleteTopics (:mod:`raylog.kafka.admin`), or None
        self.topics = None
        #: topics created on a client's Metadata request (:mod:`raylog.kafka.auto_create`), or None: off
        self.auto_create = None
        #: the Kafka-protocol groups this listener coordinates
        self.coordinator = Coordinator(metadata.zk, metadata.registry.paths, lambda: self.entry)
        #: the cluster's transaction coordinator (:mod:`raylog.kafka.transactions`)
        self.transactions = transactions.CoordinatorLink(metadata.settings.cluster)
        self._lock = threading.Lock()
        self._fetched = {"fetch_bytes_sent_from_files": 0, "fetch_bytes_relayed": 0}

    def count_fetched(self, from_files: int, relayed: int) -> None:
        """Count the record bytes of a Fetch response: sent from segment
        files (``sendfile``; over TLS read from them and sent through it) and
        read through the data channel."""
        with self._lock:
            self._fetched["fetch_bytes_sent_from_files"] += from_files
            self._fetched["fetch_bytes_relayed"] += relayed

    def fetch_stats(self) -> dict:
        """``fetch_bytes_sent_from_files`` and ``fetch_bytes_relayed`` so far."""
        with self._lock:
            return dict(self._fetched)

    @property
    def zk(self):
        return self.metadata.zk

    @property
    def paths(self):
        return self.metadata.registry.paths


class Session:
    """One client connection's state and handlers (see the module docstring)."""

    def __init__(self, backend: Backend, peer=None):
        self.backend = backend
        #: the client's address as Kafka shows it in DescribeGroups (``/127.0.0.1``), "" when not known
        self.client_host = f"/{peer[0]}" if peer else ""
        self.authenticated = backend.verifier is None
        self._exchange = None
        #: after a SaslHandshake of version 0: the SASL tokens come as bare frames
        self._bare_sasl = False
        self._connections: dict = {}
        #: (topic, partition) -> Kafka batch bytes per stored byte of its last fetch (see _read)
        self._expansion: dict = {}
        #: the read to make ahead once the reply is out, and the one made (see after_reply)
        self._ahead_key: tuple | None = None
        self._ahead: _Ahead | None = None
        self.client_id: str | None = None
        #: set when the connection must close after the reply is sent
        self.closing = False
        #: data endpoints (host, port) whose segment files this listener cannot open (see _locate)
        self._remote: set = set()
        #: (topic, partition) -> until when its reads skip LOCATE (see _locate)
        self._not_locatable: dict = {}

    def close(self) -> None:
        self._settle()
        if self._ahead is not None:
            _close_records(self._ahead.result)
            self._ahead = None
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    # -- dispatch ------------------------------------------------------------

    # -- reading ahead ---------------------------------------------------------

    def after_reply(self) -> None:
        """Called once the replies to the frames received together are out:
        a fetch that left data below the high watermark reads the next
        answer for that partition now, while the client takes in this one
        (a Kafka client sends its next fetch only after it has read the
        last answer, so the two would otherwise wait for each other). For a
        partition whose batches are sent from its segment file (see
        :meth:`_locate`) the LOCATE is sent now and its reply read when the
        next request comes (no thread: the partition answers meanwhile);
        any other read is made on a thread of its own. The next fetch uses
        it when it asks for exactly that (partition, offset, bytes) within
        :data:`READ_AHEAD_TTL_S`; anything else reads afresh. What it holds
        was below the high watermark when read: committed records, never
        taken back."""
        key, self._ahead_key = self._ahead_key, None
        if key is None or self._ahead is not None:
            return
        topic, partition = key[0], key[1]
        if self._locating(topic, partition):
            try:
                conn = self._connection(topic, partition)
                self._ahead = _Ahead(key, conn=conn, correlation=conn.send_locate(*key))
            except RaylogError as err:
                log.debug("Kafka listener: locating ahead %s: %s", key, err)
            return
        ahead = self._ahead = _Ahead(key)
        ahead.thread = threading.Thread(target=self._read_ahead, args=(ahead,), name="kafka-read-ahead",
                                        daemon=True)
        ahead.thread.start()

    def _read_ahead(self, ahead: "_Ahead") -> None:
        try:
            ahead.result = self._read(*ahead.key, 0)
            ahead.at = time.monotonic()
        except Exception as err:  # noqa: BLE001 - the fetch that wanted it reads afresh (and meets the error)
            log.debug("Kafka listener: reading ahead %s: %s", ahead.key, err)

    def _settle(self) -> None:
        """Finish a read ahead (its connection is then free): wait for its
        thread, or read the reply of its LOCATE."""
        ahead = self._ahead
        if ahead is None:
            return
        if ahead.thread is not None:
            ahead.thread.join()
            ahead.thread = None
        elif ahead.conn is not None:
            conn, ahead.conn = ahead.conn, None
            try:
                ahead.located = conn.read_locate(ahead.correlation, ahead.key[4])
            except RaylogError as err:
                log.debug("Kafka listener: locating ahead %s: %s", ahead.key, err)

    def _take_ahead(self, key: tuple):
        """The read made ahead for ``key`` if there is a fresh one (and
        forget any other)."""
        self._settle()
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        fresh = ahead.key == key and ahead.at is not None and time.monotonic() - ahead.at <= READ_AHEAD_TTL_S
        if ahead.located is not None:
            return self._locate(*key, first=ahead.located) if fresh else None
        if not fresh:
            _close_records(ahead.result)
            return None
        return ahead.result

    def handle(self, frame: bytes) -> bytes | list | None:
        """The response frame to one request frame, or None (acks=0 produce);
        a Fetch response holding file ranges is a list of pieces (see
        :func:`~raylog.kafka.fetch_wire.encode_fetch_response`). Raises
        :class:`BadFrame` when the connection must close."""
        self._settle()
        if self._bare_sasl:
            return self._bare_sasl_token(frame)
        api_key, version, correlation_id = peek_header(frame)
        if api_key == API_VERSIONS:
            _, low, high = SUPPORTED[API_VERSIONS]
            if not low <= version <= high:
                return api_versions_response(0, correlation_id, UNSUPPORTED_VERSION)
        if not self.authenticated and api_key not in _BEFORE_AUTH:
            raise BadFrame(f"api key {api_key} before SASL authentication (a client without the cluster's "
                           f"credentials: use client.kafka_config())")
        if api_key == PRODUCE:
            out: list[bytes] = []
            self.handle_produce_run([frame], out)
            return out[0] if out else None
        request = decode_request(frame)
        self.client_id = request.client_id
        if api_key == FETCH:  # written directly (raylog.kafka.fetch_wire)
            return encode_fetch_response(version, correlation_id, self._fetch(request.body))
        handler = _HANDLERS[api_key]
        response = handler(self, request.body, version)
        if response is None:
            return None
        return encode_response(response, correlation_id)

    # -- ApiVersions and SASL ------------------------------------------------

    def _api_versions(self, body, version):
        from kafka.protocol.metadata import ApiVersionsResponse

        keys = [ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high)
                for key, low, high in advertised_versions()]
        return ApiVersionsResponse[version](error_code=NONE, api_keys=keys, throttle_time_ms=0)

    def _sasl_handshake(self, body, version):
        verifier = self.backend.verifier
        # PLAIN sends the token itself: offered on a TLS listener only
        offered = [] if verifier is None else [*MECHANISMS, PLAIN] if self.backend.tls else list(MECHANISMS)
        if body.mechanism not in offered:
            return SaslHandshakeResponse[version](error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=offered)
        self._exchange = verifier.plain_exchange() if body.mechanism == PLAIN else verifier.exchange(body.mechanism)
        # version 0 (clients before SaslAuthenticate): the tokens follow as
        # bare size-prefixed frames, without Kafka request headers
        self._bare_sasl = version == 0
        return SaslHandshakeResponse[version](error_code=NONE, mechanisms=offered)

    def _bare_sasl_token(self, token: bytes) -> bytes:
        """The answer to one SASL token after a SaslHandshake of version 0:
        the server's token as a bare frame; a failure closes the connection
        (what a Kafka broker does: the protocol has no error to answer)."""
        try:
            answer = self._exchange.step(bytes(token))
        except SaslFailed as err:
            raise BadFrame(f"SASL authentication failed: {err}; the user is the cluster's name and the password "
                           f"its token (client.kafka_config() gives both)") from None
        if self._exchange.done:
            self.authenticated = True
            self._bare_sasl = False
        return SIZE.pack(len(answer)) + answer

    def _sasl_authenticate(self, body, version):
        if self._exchange is None or self.authenticated:
            self.closing = True
            return SaslAuthenticateResponse[version](
                error_code=ILLEGAL_SASL_STATE, error_message="SaslAuthenticate without a SaslHandshake first",
                auth_bytes=b"")
        try:
            answer = self._exchange.step(bytes(body.auth_bytes or b""))
        except SaslFailed as err:
            self.closing = True
            return SaslAuthenticateResponse[version](
                error_code=SASL_AUTHENTICATION_FAILED,
                error_message=f"{err}; the user is the cluster's name and the password its token "
                              f"(client.kafka_config() gives both)",
                auth_bytes=b"")
        if self._exchange.done:
            self.authenticated = True
        return SaslAuthenticateResponse[version](error_code=NONE, error_message=None, auth_bytes=answer,
                                                 session_lifetime_ms=0)

    # -- Metadata --------------------------------------------------------------

    def _metadata(self, body, version):
        backend = self.backend
        registry = backend.metadata.registry
        found = brokers.listeners(backend.zk, backend.paths)
        if backend.entry["node"] not in found:
            found[backend.entry["node"]] = backend.entry
        names = registry.list_topics() if body.topics is None else [t.name for t in body.topics]
        creation = backend.auto_create if body.topics is not None else None
        if creation is not None and version >= 4 and not body.allow_auto_topic_creation:
            creation = None
        topics = []
        for name in names:
            topic = self._topic_metadata(name, found)
            if creation is not None and topic.error_code == UNKNOWN_TOPIC_OR_PARTITION:
                # the listener creates topics asked for (raylog.kafka.auto_create)
                topic = MetadataResponse.MetadataResponseTopic(error_code=creation.request(name), name=name,
                                                               is_internal=False, partitions=[])
            topics.append(topic)
        broker_list = [MetadataResponse.MetadataResponseBroker(node_id=e["broker_id"], host=e["host"], port=e["port"],
                                                               rack=None)
                       for e in found.values()]
        return MetadataResponse[version](
            throttle_time_ms=0, brokers=broker_list, cluster_id=backend.settings.cluster,
            controller_id=backend.entry["broker_id"], topics=topics)

    def _describe_cluster(self, body, version):
        """The listeners as Kafka's brokers, as Metadata names them (this
        listener answers as the controller, as its Metadata does); a
        request for the controllers' endpoints (version 1's endpoint type
        2) is MISMATCHED_ENDPOINT_TYPE, as a broker answers it."""
        from kafka.protocol.admin import DescribeClusterResponse

        backend = self.backend
        endpoint_type = getattr(body, "endpoint_type", 1) if version >= 1 else 1
        if endpoint_type != 1:
            return DescribeClusterResponse[version](
                throttle_time_ms=0, error_code=MISMATCHED_ENDPOINT_TYPE,
                error_message="the Kafka listeners are brokers; raylog has no separate controllers to describe",
                endpoint_type=endpoint_type, cluster_id=backend.settings.cluster, controller_id=-1, brokers=[],
                authorized_operations=NO_OPERATIONS)
        found = brokers.listeners(backend.zk, backend.paths)
        if backend.entry["node"] not in found:
            found[backend.entry["node"]] = backend.entry
        Broker = DescribeClusterResponse.DescribeClusterBroker
        listed = [Broker(broker_id=e["broker_id"], host=e["host"], port=e["port"], rack=None, is_fenced=False)
                  for e in sorted(found.values(), key=lambda e: e["broker_id"])]
        # an authenticated client may do all that the cluster resource allows (no ACLs: the token is the key)
        operations = set(CLUSTER_OPERATIONS) if body.include_cluster_authorized_operations else NO_OPERATIONS
        return DescribeClusterResponse[version](
            throttle_time_ms=0, error_code=NONE, error_message=None, endpoint_type=1,
            cluster_id=backend.settings.cluster, controller_id=backend.entry["broker_id"], brokers=listed,
            authorized_operations=operations)

    def _topic_metadata(self, name, found):
        backend = self.backend
        Topic = MetadataResponse.MetadataResponseTopic
        Partition = Topic.MetadataResponsePartition
        try:
            count = backend.metadata.registry.topic_config(name).partitions
            endpoints = backend.metadata.registry.endpoints(name)
        except UnknownTopicError:
            return Topic(error_code=UNKNOWN_TOPIC_OR_PARTITION, name=name, is_internal=False, partitions=[])
        except RaylogError as err:
            log.warning("metadata of topic %s: %s", name, err)
            return Topic(error_code=LEADER_NOT_AVAILABLE, name=name, is_internal=False, partitions=[])
        partitions = []
        for p in range(count):
            endpoint = endpoints.get(p)
            entry = brokers.leader_listener(backend.zk, backend.paths, name, p, found, endpoint)
            if endpoint is None or entry is None:
                partitions.append(Partition(error_code=LEADER_NOT_AVAILABLE, partition_index=p, leader_id=-1,
                                            leader_epoch=-1, replica_nodes=[], isr_nodes=[], offline_replicas=[]))
                continue
            leader = entry["broker_id"]
            replicas, isr = brokers.replica_ids(backend.zk, backend.paths, name, p, leader)
            partitions.append(Partition(error_code=NONE, partition_index=p, leader_id=leader, leader_epoch=-1,
                                        replica_nodes=replicas, isr_nodes=isr, offline_replicas=[]))
        return Topic(error_code=NONE, name=name, is_internal=False, partitions=partitions)

    # -- data ------------------------------------------------------------------

    def _connection(self, topic: str, partition: int):
        metadata = self.backend.metadata
        host, port = metadata.endpoint(topic, partition)
        max_message_bytes = metadata.config(topic).max_message_bytes
        key = (host, port, max_message_bytes)
        conn = self._connections.get(key)
        if conn is None:
            conn = self._connections[key] = self.backend.settings.broker_connection(
                host, port, max_message_bytes=max_message_bytes)
        return conn

    def _forget(self, topic: str, partition: int, err: Exception) -> None:
        if isinstance(err, (NotOwnerError, BrokerUnavailableError, RequestTimeoutError)):
            self.backend.metadata.forget(topic, partition)

    def pipelines(self, frame: bytes) -> bool:
        """Whether ``frame`` may join a run of :meth:`handle_produce_run`: a
        Produce request on an authenticated connection."""
        return self.authenticated and len(frame) >= 2 and frame[0] == 0 and frame[1] == PRODUCE

    def handle_produce_run(self, frames, out: list) -> None:
        """Answer Produce request frames received together, appending their
        response frames to ``out`` in order (none for acks=0). The sets of
        every request are written to their partitions first, pipelined on
        each partition's connection, and the answers read after: the
        partitions see the sets in the order the requests came, and a run
        costs one round trip to a partition instead of one per request. A
        connection that fails during the run answers its remaining sets with
        that failure (nothing more is written on it in this run). Raises
        :class:`BadFrame` for a malformed frame, after the frames before it
        are answered."""
        self._settle()
        requests, failure = [], None
        for frame in frames:
            try:
                request = decode_produce(frame)
            except BadFrame as err:
                failure = err
                break
            self.client_id = request.client_id
            requests.append(request)
        for request, answered in zip(requests, self._produce_all([r.body for r in requests])):
            if request.body.acks != 0:
                out.append(encode_produce_response(request.version, request.correlation_id, answered))
        if failure is not None:
            raise failure

    def _produce_all(self, requests) -> list:
        """The answer of each request body, ``[(topic, [(partition, error
        code, base offset, error message), ...]), ...]``, their sets written
        first and answered after (see
        :meth:`handle_produce_run`), in groups of one acks value: a group is
        answered whole before the next is written, so that acks=0 sets,
        which nothing answers, never share a connection's pipeline with
        answered ones."""
        responses, i = [], 0
        while i < len(requests):
            j = i + 1
            while j < len(requests) and requests[j].acks == requests[i].acks:
                j += 1
            responses += self._produce_group(requests[i:j])
            i = j
        return responses

    def _produce_group(self, requests) -> list:
        """:meth:`_produce_all` of requests of one acks value."""
        written = []  # per request: [(topic, [entry, ...]), ...]
        outgoing: dict[int, tuple] = {}  # id(connection) -> (connection, [(entry, set), ...])
        broken: dict[int, RaylogError] = {}  # id(connection) -> its failure in this run
        for body in requests:
            acks = body.acks
            topics = []
            for topic in body.topic_data:
                partitions = []
                for data in topic.partition_data:
                    # [partition, error code, base offset, message, (connection, correlation id) or None]
                    entry = [data.index, NONE, -1, None, None]
                    partitions.append(entry)
                    if acks not in (0, 1, -1):
                        entry[1], entry[3] = INVALID_REQUIRED_ACKS, f"acks must be 0, 1 or -1 (all), not {acks}"
                        continue
                    try:
                        config = self.backend.metadata.config(topic.name)
                        stored, count = to_stored(data.records or b"", config.max_message_bytes,
                                                  config.max_inflated_limit)
                        if not count:
                            continue
                        conn = self._connection(topic.name, data.index)
                        # the batch carries its producer: the partition judges it (idempotence)
                        if not acks:
                            conn.produce(topic.name, data.index, stored, acks=0)
                            continue
                        entry[4] = (conn, None)
                        outgoing.setdefault(id(conn), (conn, []))[1].append(
                            (entry, (topic.name, data.index, stored, acks, NO_PRODUCER_ID, NO_SEQUENCE)))
                    except RecordsRefused as err:
                        entry[1], entry[3] = err.code, err.message
                    except RaylogError as err:
                        self._refused(entry, topic.name, err)
                topics.append((topic.name, partitions))
            written.append(topics)
        _write_all(outgoing, broken)
        responses = []
        for topics in written:
            answered = []
            for name, partitions in topics:
                for entry in partitions:
                    if entry[4] is not None:
                        conn, correlation = entry[4]
                        try:
                            if id(conn) in broken:
                                raise broken[id(conn)]
                            if isinstance(correlation, RaylogError):  # refused before it was sent
                                raise correlation
                            if correlation is None:  # (never sent: its connection failed first)
                                raise BrokerUnavailableError("the connection to the partition failed")
                            entry[2] = idempotence.answer(conn.read_set_reply(correlation))
                        except RecordsRefused as err:
                            entry[1], entry[3] = err.code, err.message
                        except RaylogError as err:
                            if not conn.connected:
                                broken[id(conn)] = err
                            self._refused(entry, name, err)
                    if entry[1] != NONE:
                        log.info("produce to %s-%s refused: %s", name, entry[0], entry[3])
                answered.append((name, [(index, code, base, message) for index, code, base, message, _ in partitions]))
            responses.append(answered)
        return responses

    def _refused(self, entry: list, topic: str, err: RaylogError) -> None:
        self._forget(topic, entry[0], err)
        entry[1], entry[3] = error_code(err), str(err).splitlines()[0]

    def _read(self, topic: str, partition: int, offset: int, max_bytes: int, isolation: int | None, wait_ms: int):
        """``(records bytes, high watermark, log start, next offset, last
        stable offset, aborted transactions)`` of one partition from
        ``offset`` (the next offset: where the client goes on after these
        records): at most ``max_bytes`` of Kafka batches, or the first batch
        alone when it is larger (as a Kafka broker answers).

        ``isolation`` READ_COMMITTED (a Fetch's isolation_level 1) reads
        with FETCH and LOCATE version 1: only records below the partition's
        last stable offset, with the aborted transactions
        (``(producer id, first offset)``) they overlap, whose batches the
        Kafka client drops itself; None reads every record below the high
        watermark (the last stable offset answered is the high watermark,
        no transaction named).

        Stored format-2 batches are Kafka's own: they go as they are, cut at
        whole batches by their headers alone
        (:func:`~raylog.kafka.records.stored_batches`; no record is decoded
        or encoded), a batch whose records all lie before ``offset`` passed
        over.

        Stored format-1 messages are not Kafka bytes: a compressed wrapper inflates into
        an uncompressed batch (tenfold and more for repetitive values), so
        the stored bytes asked for are ``max_bytes`` divided by what the
        partition's last fetch on this connection inflated by, and the
        records are cut at ``max_bytes``; the client goes on from the first
        record left out (an offset inside a wrapper is served).

        When the partition's data server runs on this machine, stored
        batches are not read at all: the partition says where they lie
        (LOCATE) and the records returned are a
        :class:`~raylog.kafka.file_ranges.FileRange` of the segment file,
        sent to the client by ``sendfile`` (see :meth:`_locate`)."""
        located = self._locate(topic, partition, offset, max_bytes, isolation)
        if located is not None:
            return located
        conn = self._connection(topic, partition)
        max_message_bytes = self.backend.metadata.config(topic).max_message_bytes
        key = (topic, partition)
        stored_bytes = max(1, min(max_bytes, int(max_bytes / self._expansion.get(key, _FIRST_EXPANSION))))
        start, hw, log_start, lso, aborted = offset, -1, -1, -1, ()
        for _ in range(_SKIPS):
            try:
                result = conn.fetch(topic, partition, start, stored_bytes, wait_ms, isolation=isolation)
            except InvalidOffsetError as err:
                details = err.details
                low, high = details.get("message_offset"), details.get("next_offset")
                if not isinstance(low, int) or not isinstance(high, int):
                    raise
                start = low if "wrapper_offset" in details else high
                wait_ms = 0
                continue
            wait_ms = 0
            hw, log_start = result.high_watermark, result.log_start_offset
            lso, aborted = _transactions_of(result)
            if format_at(result.data) == 2:  # stored batches go as they are
                self._expansion[key] = 1.0
                batches, end, walked = stored_batches(result.data, offset, max_bytes)
                if batches or not walked:
                    return batches, hw, log_start, max(end, offset) if batches else offset, lso, aborted
                start = end  # a batch whose records all lie before offset
                continue
            records, consumed = decode_messages(result.data, result.offset, max_message_bytes=max_message_bytes)
            if not consumed:
                return b"", hw, log_start, offset, lso, aborted
            end = result.offset + consumed
            if records and records[0][0] < offset:  # a wrapper's records before the offset asked for
                records = [r for r in records if r[0] >= offset]
            if records:
                batch = encode_batch(records, end)
                if len(self._expansion) >= _MAX_EXPANSIONS:
                    self._expansion.clear()
                self._expansion[key] = max(1.0, len(batch) / consumed)
                if len(batch) > max_bytes and len(records) > 1:
                    keep = _cut(records, max(1, len(records) * max_bytes // len(batch)))
                    end = records[keep][0]
                    batch = encode_batch(records[:keep], end)
                return batch, hw, log_start, end, lso, aborted
            start = end  # a wrapper's tail holding no record at or after offset
        return b"", hw, log_start, start, lso, aborted

    def _locating(self, topic: str, partition: int) -> bool:
        """Whether reads of the partition ask LOCATE first (see :meth:`_locate`)."""
        conn = self._connection(topic, partition)
        endpoint = conn.host, conn.port
        if endpoint in self._remote:
            return False
        key = (topic, partition)
        if key in self._not_locatable:
            if time.monotonic() < self._not_locatable[key]:
                return False
            del self._not_locatable[key]
        if not _is_local_address(conn.host):
            self._remote.add(endpoint)
            return False
        return True

    def _locate(self, topic: str, partition: int, offset: int, max_bytes: int, isolation: int | None = None, *,
                first=None):
        """:meth:`_read`'s answer as a file range of the partition's
        segment, or None when the bytes must be read through the data
        channel: the data server is not on this machine (its address is not
        one of this host's; its segment files are not this machine's
        either), the bytes are not format-2 batches in a segment file, the
        segment cannot be opened as located (retention deleted it since, or
        it is not the file located), or the offset is not one LOCATE
        serves (the relayed read says why). ``first``: the reply of a
        LOCATE for ``offset`` made ahead (:meth:`after_reply`)."""
        if first is None and not self._locating(topic, partition):
            return None
        conn = self._connection(topic, partition)
        key = (topic, partition)
        start = offset
        for _ in range(_SKIPS):
            try:
                found, first = first or conn.locate(topic, partition, start, max_bytes, isolation), None
            except (InvalidOffsetError, CorruptMessageError):
                return None
            except ProtocolError:  # a data server that does not know LOCATE (an older raylog)
                self._remote.add((conn.host, conn.port))
                return None
            hw, log_start = found.high_watermark, found.log_start_offset
            lso, aborted = _transactions_of(found)
            if found.kind != LOCATED_BATCHES:  # format 1 (converted) or a log in memory
                if len(self._not_locatable) >= _MAX_EXPANSIONS:
                    self._not_locatable.clear()
                self._not_locatable[key] = time.monotonic() + _NOT_LOCATABLE_S
                return None
            if found.length:
                records = open_located(found)
                if records is None:
                    return None
                self._expansion[key] = 1.0
                return records, hw, log_start, found.next_offset, lso, aborted
            if found.next_offset <= start:  # nothing at the offset yet
                return b"", hw, log_start, offset, lso, aborted
            start = found.next_offset  # batches whose records all lie before offset
        return b"", hw, log_start, start, lso, aborted

    def _fetch(self, body):
        """A Fetch's answer, ``[(topic, [(partition, error code, high
        watermark, log start, records), ...]), ...]`` for
        :func:`~raylog.kafka.fetch_wire.encode_fetch_response`."""
        deadline = time.monotonic() + max(0, body.max_wait_ms) / 1000.0
        wanted = [(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
                  for t in body.topics for p in t.partitions]
        # isolation_level 1: read_committed (below the last stable offset, the aborted transactions named)
        isolation = READ_COMMITTED if getattr(body, "isolation_level", 0) == 1 else None
        while True:
            results, total, failed = self._fetch_round(wanted, body.max_bytes, isolation)
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if total >= max(1, body.min_bytes) or failed or remaining_ms <= 0 or not wanted:
                break
            for result in results:  # read again after the long poll
                _close_records(result[1])
            topic, partition, offset, max_bytes = wanted[0]
            wait_ms = min(remaining_ms, _POLL_SLICE_MS if len(wanted) > 1 else remaining_ms)
            try:  # a long poll on the first partition (read_committed: on its LSO); the next round reads them all
                self._connection(topic, partition).fetch(topic, partition, offset, 1, wait_ms, isolation=isolation)
            except RaylogError:
                pass
        from_files = sum(len(r[1]) for r in results if isinstance(r[1], FileRange))
        self.backend.count_fetched(from_files, sum(len(r[1]) for r in results) - from_files)
        by_topic: dict[str, list] = {}
        for (topic, partition, _, _), (code, records, hw, start, lso, aborted) in zip(wanted, results):
            by_topic.setdefault(topic, []).append((partition, code, hw, start, records, lso, aborted))
        return list(by_topic.items())

    def _fetch_round(self, wanted, response_max_bytes: int, isolation: int | None = None):
        """One read of every partition wanted: ``(code, records, high
        watermark, log start, last stable offset, aborted transactions)``
        each (see :meth:`_read`)."""
        results, total, failed = [], 0, False
        self._ahead_key = None
        for topic, partition, offset, max_bytes in wanted:
            budget = max(1, min(max_bytes, response_max_bytes - total)) if total else max(1, max_bytes)
            try:
                key = (topic, partition, offset, budget, isolation)
                found = self._take_ahead(key)
                if found is None:
                    found = self._read(*key, 0)
                records, hw, start, next_offset, lso, aborted = found
                results.append((NONE, records, hw, start, lso, aborted))
                total += len(records)
                if records and next_offset < lso and self._ahead_key is None:
                    self._ahead_key = (topic, partition, next_offset, budget, isolation)
            except OffsetOutOfRangeError as err:
                failed = True
                latest = err.details.get("latest", -1)
                results.append((OFFSET_OUT_OF_RANGE, b"", latest, err.details.get("earliest", -1), latest, ()))
            except RaylogError as err:
                failed = True
                self._forget(topic, partition, err)
                results.append((error_code(err), b"", -1, -1, -1, ()))
        return results, total, failed

    def _list_offsets(self, body, version):
        Topic = ListOffsetsResponse.ListOffsetsTopicResponse
        Partition = Topic.ListOffsetsPartitionResponse
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                code, ts, offset = NONE, -1, -1
                try:
                    ts, offset = self._offset_for(topic.name, p.partition_index, p.timestamp)
                except RaylogError as err:
                    self._forget(topic.name, p.partition_index, err)
                    code = error_code(err)
                partitions.append(Partition(partition_index=p.partition_index, error_code=code, timestamp=ts,
                                            offset=offset, leader_epoch=-1))
            topics.append(Topic(name=topic.name, partitions=partitions))
        return ListOffsetsResponse[version](throttle_time_ms=0, topics=topics)

    def _records_end(self, conn, topic: str, partition: int, offsets) -> int:
        """ListOffsets' latest offset: the offset after the last record below
        the high watermark (its batch's baseOffset + record count), the
        position a Kafka consumer reaches when it has read everything.

        A raylog offset is a byte position (docs/design.md section 2), so the
        high watermark, the next batch's position, lies past the last
        record's offset + 1. librdkafka's position (and so what it commits)
        is the last record handed out + 1: answered the high watermark, a
        consumer that has read everything would stay behind the end for
        ever (lag that never reaches 0; Quix Streams' changelog recovery,
        which waits for position >= latest, never ending). No record lies
        between the two, and a read from this offset returns the last batch,
        whose records all lie before it, then goes on at the high watermark.
        Fetch answers keep the high watermark itself (librdkafka's
        end-of-partition event compares the fetch position with it)."""
        hw = offsets.high_watermark
        if hw <= offsets.log_start_offset:
            return hw
        try:  # the batch (or format-1 message) that holds hw - 1: the last one
            result = conn.fetch(topic, partition, hw - 1, 1, 0, inside_wrapper=True)
        except InvalidOffsetError as err:  # inside a plain format-1 message: read from its start
            start = err.details.get("message_offset")
            if not isinstance(start, int) or not offsets.log_start_offset <= start < hw:
                raise
            result = conn.fetch(topic, partition, start, 1, 0)
        data = result.data
        if format_at(data) == 2:
            last = None
            for _, header in iter_batches(data):
                last = header
            if last is None or last.next_offset < hw:  # not the log's last batch: keep the high watermark
                return hw
            return last.base_offset + last.count
        records, _ = decode_messages(data, result.offset)
        return records[-1][0] + 1 if records else hw

    def _offset_for(self, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
        """``(timestamp, offset)`` answered for ListOffsets: -1 latest, -2
        earliest, else the first message at or after ``timestamp``."""
        conn = self._connection(topic, partition)
        offsets = conn.offsets(topic, partition)
        if timestamp == -1:
            return -1, self._records_end(conn, topic, partition, offsets)
        if timestamp == -2:
            return -1, offsets.log_start_offset
        if timestamp < 0:
            raise InvalidMessageError(f"ListOffsets timestamp {timestamp} is not served (-1, -2 or a time)")
        offset = conn.offset_for_time(topic, partition, timestamp)
        if offset >= offsets.high_watermark:
            return -1, -1
        result = conn.fetch(topic, partition, offset, 1, 0, inside_wrapper=True)
        records, _ = decode_messages(result.data, result.offset)
        for found_offset, found_ts, _, _ in records:
            if found_offset >= offset and found_ts >= timestamp:
                return found_ts, found_offset
        return timestamp, offset


def _transactions_of(read) -> tuple[int, list]:
    """``(last stable offset, aborted transactions)`` of a FETCH or LOCATE
    answer as a Kafka Fetch response carries them: the answer's own for a
    version 1 read, ``(producer id, first offset)`` each; the high
    watermark and none for a version 0 read."""
    if read.last_stable_offset is None:
        return read.high_watermark, []
    return read.last_stable_offset, [(pid, first) for pid, first, _ in read.aborted]


class _Ahead:
    """A read made ahead for ``key`` (see :meth:`Session.after_reply`):
    a thread that leaves ``result`` (a :meth:`Session._read` answer), or a
    LOCATE sent on ``conn`` as ``correlation`` whose reply becomes
    ``located``; ``at`` is when it was made. Confined to its session's
    thread (and the read-ahead thread until joined)."""

    __slots__ = ("key", "thread", "result", "conn", "correlation", "located", "at")

    def __init__(self, key: tuple, conn=None, correlation: int | None = None):
        self.key = key
        self.thread: threading.Thread | None = None
        self.result = None
        self.conn, self.correlation = conn, correlation
        self.located = None
        self.at: float | None = time.monotonic() if conn is not None else None


def _close_records(found) -> None:
    """Close the file of a read's records that will not be sent (a
    :class:`~raylog.kafka.file_ranges.FileRange`; bytes need nothing):
    ``found`` is the records or a :meth:`Session._read` answer."""
    records = found[0] if isinstance(found, tuple) else found
    if isinstance(records, FileRange):
        records.close()


#: address -> whether it is one of this host's (see _is_local_address)
_LOCAL_ADDRESSES: dict = {}


def _is_local_address(host: str) -> bool:
    """Whether ``host`` is an address of this machine (of its network
    namespace): one a socket can be bound to here. Remembered per address
    (any thread: a lost race only probes an address twice)."""
    known = _LOCAL_ADDRESSES.get(host)
    if known is None:
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
            known = True
        except OSError:
            known = False
        if len(_LOCAL_ADDRESSES) < 1024:
            _LOCAL_ADDRESSES[host] = known
    return known


def _cut(records, keep: int) -> int:
    """``keep`` moved back to the start of a stored message where one is
    near (the inner records of a wrapper have consecutive offsets; a cut
    between them makes the next fetch read the wrapper again); ``keep``
    itself when the records before it are one wrapper."""
    at = keep
    while at > 0 and records[at][0] == records[at - 1][0] + 1:
        at -= 1
    return at or keep


def _write_all(outgoing: dict, broken: dict) -> None:
    """Write the sets waiting in ``outgoing`` (one write per connection),
    marking each entry with its correlation id; a connection that fails is
    put in ``broken`` with its failure (its sets are answered with it)."""
    for key, (conn, sets) in outgoing.items():
        if key in broken:
            continue
        try:
            for (entry, _), correlation in zip(sets, conn.write_sets([one for _, one in sets])):
                entry[4] = (conn, correlation)
        except RaylogError as err:
            broken[key] = err
    outgoing.clear()


def _find_coordinator(session, body, version):
    if getattr(body, "key_type", 0) == transactions.TRANSACTION_KEY_TYPE:
        return transactions.find_coordinator(body, version, session.backend.transactions, session.backend.entry)
    return group_offsets.find_coordinator(body, version, session.backend.coordinator.entry_for(body.key))


def _offset_commit(session, body, version):
    return group_offsets.offset_commit(body, version, session.backend.offsets, session.backend.metadata.registry,
                                       session.backend.coordinator)


def _offset_fetch(session, body, version):
    return group_offsets.offset_fetch(body, version, session.backend.offsets)


def _init_producer_id(session, body, version):
    if body.transactional_id is not None:
        return transactions.init_producer_id(body, version, session.backend.transactions)
    return idempotence.init_producer_id(body, version)


def _create_topics(session, body, version):
    return admin.create_topics(session.backend, body, version)


def _delete_topics(session, body, version):
    return admin.delete_topics(session.backend, body, version)


def _describe_configs(session, body, version):
    return admin.describe_configs(session.backend, body, version)


_HANDLERS = {
    INIT_PRODUCER_ID: _init_producer_id,
    ADD_PARTITIONS_TO_TXN: lambda session, body, version: transactions.add_partitions(
        body, version, session.backend.transactions, session.backend.metadata.registry),
    ADD_OFFSETS_TO_TXN: lambda session, body, version: transactions.add_offsets(body, version,
                                                                                session.backend.transactions),
    END_TXN: lambda session, body, version: transactions.end_transaction(body, version, session.backend.transactions),
    TXN_OFFSET_COMMIT: lambda session, body, version: transactions.txn_offset_commit(body, version,
                                                                                     session.backend.transactions),
    CREATE_TOPICS: _create_topics,
    DELETE_TOPICS: _delete_topics,
    DESCRIBE_CONFIGS: _describe_configs,
    CREATE_PARTITIONS: lambda session, body, version: admin.create_partitions(session.backend, body, version),
    DELETE_RECORDS: lambda session, body, version: admin.delete_records(session.backend, body, version),
    ALTER_CONFIGS: lambda session, body, version: admin.alter_configs(session.backend, body, version),
    INCREMENTAL_ALTER_CONFIGS: lambda session, body, version: admin.incremental_alter_configs(session.backend,
                                                                                             body, version),
    JOIN_GROUP: lambda session, body, version: session.backend.coordinator.join_group(
        body, version, session.client_id, session.client_host),
    LIST_GROUPS: lambda session, body, version: group_admin.list_groups(session.backend, body, version),
    DESCRIBE_GROUPS: lambda session, body, version: group_admin.describe_groups(session.backend, body, version),
    DELETE_GROUPS: lambda session, body, version: group_admin.delete_groups(session.backend, body, version),
    OFFSET_DELETE: lambda session, body, version: group_admin.offset_delete(session.backend, body, version),
    DESCRIBE_CLUSTER: Session._describe_cluster,
    LIST_TRANSACTIONS: lambda session, body, version: transaction_admin.list_transactions(session.backend, body,
                                                                                          version),
    DESCRIBE_TRANSACTIONS: lambda session, body, version: transaction_admin.describe_transactions(
        session.backend, body, version),
    DESCRIBE_PRODUCERS: lambda session, body, version: transaction_admin.describe_producers(session.backend, body,
                                                                                          version),
    SYNC_GROUP: lambda session, body, version: session.backend.coordinator.sync_group(body, version),
    HEARTBEAT: lambda session, body, version: session.backend.coordinator.heartbeat(body, version),
    LEAVE_GROUP: lambda session, body, version: session.backend.coordinator.leave_group(body, version),
    OFFSET_COMMIT: _offset_commit,
    OFFSET_FETCH: _offset_fetch,
    FIND_COORDINATOR: _find_coordinator,
    LIST_OFFSETS: Session._list_offsets,
    METADATA: Session._metadata,
    SASL_HANDSHAKE: Session._sasl_handshake,
    API_VERSIONS: Session._api_versions,
    SASL_AUTHENTICATE: Session._sasl_authenticate,
}
