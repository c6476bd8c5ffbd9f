"""Errors raised by raylog.

Every error derives from :class:`RaylogError`. Each class says, in its
message, what the caller can do next, and carries two properties so callers
branch on meaning rather than on long ``except`` chains or ``isinstance``:

* ``retriable``: the same call may succeed if repeated later;
* ``refresh_metadata``: the partition's endpoint as the caller knows it is
  wrong or gone (not the owner, unreachable, no reply): look it up again in
  the registry (``Metadata.endpoint(..., refresh=True)``) before the next try.

Errors that cross the data channel have a numeric ``code``; the classes
register themselves with :func:`_code` and :func:`error_for_code` maps a
code received from a broker back to the class (in the manner of kazoo's
exception registry).

The hierarchy, in source order (a class with a second base outside this
module names it; ``tests/test_errors.py`` holds the drawing to the classes)::

    Exception
    └── RaylogError
        ├── ConfigError
        │   ├── ArgumentTypeError (also TypeError)
        │   ├── ConfigNotLiveError
        │   ├── InvalidPartitionsError
        │   ├── InvalidReassignmentError
        │   ├── AssignorError
        │   └── InvalidTransactionTimeoutError
        ├── ClosedError
        ├── DeliveryError
        ├── InvalidMessageError
        │   ├── CorruptMessageError
        │   ├── MessageTooLargeError
        │   │   └── InflatedSizeTooLargeError
        │   ├── MissingKeyError
        │   └── ControlBatchError
        ├── OffsetOutOfRangeError
        │   └── DataLossError
        ├── BenchError
        ├── InvalidOffsetError
        ├── StorageError
        │   ├── DiskFullError
        │   ├── LogDirectoryLockedError
        │   └── LogInUseError
        ├── StorageFormatError
        ├── OutOfOrderSequenceError
        ├── DuplicateSequenceError
        ├── TransactionCoordinatorFencedError
        ├── ProtocolError
        │   └── FrameTooLargeError
        ├── AuthenticationError
        │   └── ClusterPathTakenError
        ├── NotOwnerError
        │   ├── PartitionNotAssignedError
        │   └── StaleEpochError
        ├── BrokerUnavailableError
        │   └── TooManyConnectionsError
        ├── RequestTimeoutError
        ├── NotEnoughReplicasError
        ├── UnknownTopicError
        ├── TopicExistsError
        ├── UnknownPartitionError
        ├── ReassignmentTimeoutError
        ├── HandoffError
        ├── RollingRestartError
        ├── ZooKeeperUnavailableError
        │   └── SessionExpiredError
        ├── EmbeddedZooKeeperError
        ├── RayUnavailableError
        ├── RebalanceError
        ├── UnknownGroupError
        ├── GroupActiveError
        ├── MixedGroupError
        ├── SchemaError
        │   └── UnknownSchemaError
        ├── ResourcesUnavailableError
        ├── ConcurrentLoadError
        ├── FaultInjectionError (also AssertionError)
        ├── DataDirInUseError
        ├── MirrorSourceError
        ├── MirrorNoTopicsError
        ├── MirrorTopicMismatchError
        ├── MirrorNotFoundError
        ├── MirrorFormatError
        ├── PoolNotFoundError
        ├── PoolExistsError
        └── TransactionError
            ├── ProducerFencedError
            ├── InvalidProducerEpochError
            ├── InvalidTxnStateError
            ├── ConcurrentTransactionsError
            ├── InvalidProducerIdMappingError
            ├── TransactionStateConflictError
            └── ProducerIdsExhaustedError
"""

from __future__ import annotations

_BY_CODE: dict[int, type["RaylogError"]] = {}


def _code(code: int):
    """Register an error class under a wire error code."""

    def register(cls):
        if code in _BY_CODE:
            raise RuntimeError(f"error code {code} registered twice")
        cls.code = code
        _BY_CODE[code] = cls
        return cls

    return register


class RaylogError(Exception):
    """Base class of every raylog error."""

    code = 1
    #: True when the same call may succeed if repeated later.
    retriable = False
    #: True when the caller must look up the partition's endpoint again
    #: before it retries (the actor moved, restarted or does not answer).
    refresh_metadata = False

    def __init__(self, message: str = "", **details):
        super().__init__(message)
        self.details = details
        self.__dict__.update(details)

    def __reduce__(self):
        # Keep details when the error crosses a Ray or process boundary.
        return (_rebuild, (type(self), str(self), self.details))


def _rebuild(cls, message, details):
    err = cls.__new__(cls)
    RaylogError.__init__(err, message, **details)
    return err


_BY_CODE[1] = RaylogError


def error_for_code(code: int, message: str, **details) -> RaylogError:
    """Build the error a broker reported with ``code``."""
    cls = _BY_CODE.get(code, RaylogError)
    return cls(message, **details)


# --------------------------------------------------------------------------
# configuration and usage


@_code(2)
class ConfigError(RaylogError):
    """A setting is missing or out of range; fix the argument and call again."""


@_code(3)
class ClosedError(RaylogError):
    """The object (producer, consumer, client, log) was closed; create a new one."""


@_code(7)
class ArgumentTypeError(ConfigError, TypeError):
    """An argument has the wrong type (a topic that is not a str, a key or
    value that is not bytes); the message names the argument, the type given
    and how to convert it. Also a ``TypeError``, as Python's own would be.
    Nothing of the call was queued or stored."""


@_code(190)
class ConfigNotLiveError(ConfigError):
    """A setting that cannot change on a live topic (``client.alter_topic``,
    Kafka's AlterConfigs): ``partitions`` and ``replication_factor`` are
    fixed when the topic is made (docs/design.md sections 4 and 7), and the
    bounds clients, servers and recovery read once (``max_message_bytes``,
    ``max_inflated_bytes``, ``max_producer_ids``) or a leader holds from its
    start (``min_insync_replicas``, ``replica_lag_ms``) are too. The message
    names the setting and why; ``setting`` holds its name. Nothing was
    changed: make a new topic with the setting wanted (and copy the data,
    e.g. with a mirror) instead."""


@_code(191)
class InvalidPartitionsError(ConfigError):
    """``client.add_partitions`` (Kafka's CreatePartitions) was given a
    total that is not larger than the topic's partition count now (a
    topic's partitions only grow) or above ``MAX_PARTITIONS``; ``current``
    holds the count now. Nothing was changed: pass a larger total."""


# --------------------------------------------------------------------------
# messages and storage


@_code(69)
class DeliveryError(RaylogError):
    """Messages failed for good after the producer's retries. ``failures``
    maps each failed ``(topic, partition)`` to ``(messages lost, error)``;
    every message not counted there was delivered. Raised by
    ``Producer.flush``/``close`` and by a ``send_batch`` future for its own
    messages. Look at each partition's error (``retriable`` says whether
    sending again may help)."""

    @classmethod
    def of(cls, failures: dict, total: int | None = None) -> "DeliveryError":
        lost = sum(n for n, _ in failures.values())
        parts = "; ".join(
            f"{topic}-{partition}: {n} message{'s' if n != 1 else ''} lost ({type(err).__name__}: {err})"
            for (topic, partition), (n, err) in sorted(failures.items())
        )
        scope = f" of {total}" if total is not None else ""
        return cls(
            f"{lost}{scope} messages failed in {len(failures)} topic-partition(s), the rest were delivered: {parts}",
            failures=dict(failures),
        )


@_code(10)
class InvalidMessageError(RaylogError):
    """A message or message set does not follow the format (bad magic, size or
    attributes). Nothing of the request was stored; fix the producer."""


@_code(11)
class CorruptMessageError(InvalidMessageError):
    """A stored message is damaged: its CRC32C does not match its bytes, or
    its size field cannot be one (``offset`` names it). When the log was
    searched past it, ``next_offset`` is the offset of the next readable
    message (or the log end): ``consumer.skip_corrupt()`` (``raylog consume
    --skip-corrupt``) moves there, skipping ``[offset, next_offset)``."""

    next_offset = None


@_code(12)
class MessageTooLargeError(InvalidMessageError):
    """A message or frame is larger than the configured maximum; raise
    ``max_message_bytes`` on the topic or send smaller messages."""


@_code(29)
class MissingKeyError(InvalidMessageError):
    """A record without a key was sent to a compacted topic
    (``cleanup_policy`` ``compact`` or ``compact,delete``), whose cleaner
    keeps the latest record of each key: nothing of the request was stored.
    Give every record a key, or send keyless records to a topic with
    ``cleanup_policy="delete"``."""


@_code(13)
class OffsetOutOfRangeError(RaylogError):
    """The offset is outside ``[earliest, latest]`` of the partition log.

    Attributes ``offset``, ``earliest`` and ``latest`` say where valid reads
    start and end; seek to one of them.
    """


@_code(100)
class BenchError(RaylogError):
    """The benchmark could not run to the end; the message says where it stopped."""


@_code(110)
class DataLossError(OffsetOutOfRangeError):
    """A range to read was (in part) deleted by retention before it was read.

    ``topic``, ``partition``, ``lost_start`` and ``lost_end`` name the lost
    byte range; ``earliest`` and ``latest`` are the partition's log start and
    high watermark. Read from ``earliest`` on, or pass
    ``fail_on_data_loss=False`` to skip what was lost (it is reported).
    """


@_code(14)
class InvalidOffsetError(RaylogError):
    """The offset lies inside the log but not on a message boundary; use an
    offset returned by the log (a message's offset or a committed offset)."""


@_code(15)
class StorageError(RaylogError):
    """The partition's disk failed; the partition actor restarts and recovers."""

    retriable = True


@_code(28)
class DiskFullError(StorageError):
    """The disk of a partition is full (``node``, ``path``): the set was
    not stored. The partition keeps serving reads and accepts writes again
    by itself once space is freed; retry later, or free space on that disk."""

    retriable = True


@_code(36)
class StorageFormatError(RaylogError):
    """A partition directory holds files in an on-disk format version this
    raylog does not know (``path``, ``found``, ``known``), or its format file
    is damaged: nothing was read, truncated or rewritten. Open it with the
    raylog version that wrote it (or a newer one)."""

    retriable = False


@_code(16)
class OutOfOrderSequenceError(RaylogError):
    """An idempotent producer's set skipped sequence numbers (``sequence`` is
    more than one past the last the partition stored for the producer id):
    a set in between was lost. The set was not stored; it fails alone
    (``topic``, ``partition``, ``producer_id``, ``sequence``, ``expected``)."""


@_code(17)
class DuplicateSequenceError(RaylogError):
    """An idempotent producer's set has a sequence number the partition
    stored already but no longer remembers the offset of (older than the
    last 32). It was stored once; it is not stored again and its offset is
    unknown."""


# -- transactions, the partition's side (raylog.storage.transactions) ---------


@_code(170)
class ControlBatchError(InvalidMessageError):
    """A client sent a control batch (a transaction marker, attributes bit 5):
    only the partition's transaction coordinator writes markers, through
    the partition itself. Nothing of the request was stored; send data
    batches only, and end a transaction with ``commit_transaction()`` or
    ``abort_transaction()``."""


@_code(173)
class TransactionCoordinatorFencedError(RaylogError):
    """A transaction marker came from a coordinator of an older
    ``coordinator_epoch`` than one that already wrote a marker for the
    producer: a newer coordinator took over. The marker was not stored;
    the old coordinator must stop (the new one completes the transaction)."""


@_code(18)
class InflatedSizeTooLargeError(MessageTooLargeError):
    """A compressed wrapper inflates to more than the topic's
    ``max_inflated_bytes`` (``limit``); it was refused before inflating past
    the limit. Send smaller compressed batches or raise the topic's limit."""


@_code(19)
class LogDirectoryLockedError(StorageError):
    """Another owner holds the lock of the partition directory (a partition
    actor still running on it, maybe of another cluster sharing the data
    directory). Stop that owner or give each cluster its own directory."""

    retriable = False


# --------------------------------------------------------------------------
# the data channel


@_code(20)
class ProtocolError(RaylogError):
    """A frame on the data channel was malformed; the connection is closed."""


@_code(21)
class FrameTooLargeError(ProtocolError):
    """A frame claims more bytes than the endpoint accepts; it was refused
    before any allocation. Send smaller message sets."""


@_code(22)
class AuthenticationError(RaylogError):
    """The connection did not present the cluster token; pass the cluster's
    token (``raylog.connect(token=...)``)."""


@_code(91)
class ClusterPathTakenError(AuthenticationError):
    """A cluster's ZooKeeper node (``/raylog/<cluster>``, or a node above or
    below it) is held by another identity than the session's: someone without
    this token made it first. The message names the path and its holder;
    choose another cluster name, or remove the node with the ZooKeeper's
    admin credentials (or pass the cluster's token, if it was a wrong one)."""


@_code(23)
class NotOwnerError(RaylogError):
    """This endpoint does not serve the partition; refresh the endpoint from
    the registry and retry (clients do this themselves)."""

    retriable = True
    refresh_metadata = True


@_code(24)
class BrokerUnavailableError(RaylogError):
    """The partition's endpoint could not be reached; it may be restarting.
    Retry after a short wait."""

    retriable = True
    refresh_metadata = True


@_code(25)
class RequestTimeoutError(RaylogError):
    """No reply came within the request timeout; retry or raise the timeout."""

    retriable = True
    refresh_metadata = True


@_code(26)
class TooManyConnectionsError(BrokerUnavailableError):
    """The endpoint serves its maximum of connections already; the new one
    was refused and closed. Retry after a short wait (idle connections are
    timed out by the server)."""

    retriable = True


@_code(27)
class NotEnoughReplicasError(RaylogError):
    """Fewer in-sync replicas than the acks level requires (reserved for
    replication). Retry after a short wait."""

    retriable = True


# --------------------------------------------------------------------------
# topics and the registry


@_code(30)
class UnknownTopicError(RaylogError):
    """The topic does not exist; create it with ``client.create_topic``."""


@_code(31)
class TopicExistsError(RaylogError):
    """A topic of that name already exists; pick another name or delete it."""


@_code(32)
class UnknownPartitionError(RaylogError):
    """The topic has no such partition; see ``client.describe_topic``."""


@_code(33)
class InvalidReassignmentError(ConfigError):
    """A replica reassignment was refused before anything changed: the
    topic is not replicated, or the target replicas are not distinct alive
    disk nodes, as many as the topic's ``replication_factor``."""


@_code(34)
class ReassignmentTimeoutError(RaylogError):
    """The new replicas of a reassignment did not join the in-sync replicas
    (or no target replica took the lead) in time; what was started is
    rolled back where it still can be. Retry, with a longer timeout."""

    retriable = True


@_code(35)
class HandoffError(RaylogError):
    """A leader handoff (drain, balance, reassignment) did not complete: the
    chosen replica did not catch up in time, or it is not in sync; the old
    leader accepts writes again and nothing changed. Retry, or name another
    in-sync replica."""

    retriable = True


@_code(37)
class RollingRestartError(RaylogError):
    """A node of a rolling restart could not be drained or did not come back
    with all its replicas in sync in time; the nodes after it were not
    touched. Retry once the cluster is whole (``raylog topics describe``)."""

    retriable = True


# --------------------------------------------------------------------------
# ZooKeeper and consumer groups


@_code(40)
class ZooKeeperUnavailableError(RaylogError):
    """ZooKeeper cannot be reached; check that it runs and the address is right.
    Calls succeed again once it is back."""

    retriable = True


@_code(90)
class EmbeddedZooKeeperError(RaylogError):
    """The embedded ZooKeeper server could not be started (java or the jars
    are missing, or the server exited); the message says which and shows the
    tail of the server's output."""


@_code(49)
class RayUnavailableError(RaylogError):
    """The Ray cluster at the given address could not be reached within the
    connection deadline; check the address (HOST:PORT of the head's GCS, as
    ``ray start --head`` printed it) and that the head runs, then call again."""

    retriable = True


@_code(41)
class SessionExpiredError(ZooKeeperUnavailableError):
    """The ZooKeeper session expired; ephemeral nodes are gone and the client
    re-registers. Retry the call."""


@_code(42)
class RebalanceError(RaylogError):
    """A consumer-group rebalance did not complete within its retries; the
    consumer stops rather than leaving partitions unread. Restart it."""

    retriable = True


@_code(44)
class PartitionNotAssignedError(NotOwnerError):
    """The consumer does not own the partition (it was never assigned to it, a
    rebalance took it away, or the consumer is disconnected); commit only
    partitions of the current assignment, from ``on_revoked`` at the latest."""

    retriable = False
    refresh_metadata = False  # the group's ownership, not the endpoint, is the matter


@_code(45)
class StaleEpochError(NotOwnerError):
    """A newer incarnation of this partition actor has registered; this one
    must stop serving (not retriable)."""

    retriable = False
    refresh_metadata = True  # the newer incarnation has its own endpoint


@_code(43)
class UnknownGroupError(RaylogError):
    """No consumer group of that name has members or committed offsets."""


@_code(48)
class GroupActiveError(RaylogError):
    """The consumer group has live members: deleting it, resetting its
    offsets or streaming it (``read_raylog_stream``) now would race with
    their commits. Stop them first (retriable:
    it succeeds once the members are gone)."""

    retriable = True


@_code(160)
class MixedGroupError(RaylogError):
    """The consumer group has live members of the other kind: Kafka clients
    joined through the Kafka listener (or raylog consumers, seen from a
    Kafka client). A group is coordinated either by raylog or by the Kafka
    protocol, never both; use another group name, or stop the other
    consumers first."""


@_code(161)
class AssignorError(ConfigError):
    """A consumer's ``partition_assignment_strategy`` names no known assignor
    (the message lists the known names: ``range``, ``round_robin``,
    ``sticky``), lists one twice, or holds something that is not an
    assignor; or a user's assignor gave a partition no owner, two owners or
    an owner not subscribed to its topic. Fix the option or the assignor;
    nothing was assigned by it, and a consumer refused for it never joined."""


@_code(50)
class SchemaError(RaylogError):
    """A schema is invalid or a value does not match its schema."""


@_code(51)
class UnknownSchemaError(SchemaError):
    """No schema is registered under that id; register it first."""


@_code(52)
class ResourcesUnavailableError(RaylogError):
    """The Ray cluster lacks the resources a job of raylog asks for (say,
    CPUs for read tasks while Spark executors hold them all); the message
    names what is needed and what is free. Not sent over the wire."""

    retriable = True


# --------------------------------------------------------------------------
# components outside the data path (codes 70-79)


@_code(70)
class LogInUseError(StorageError):
    """A deleted partition's directory is locked by a running owner; it is
    removed once that owner stops (the next repair pass)."""


@_code(71)
class ConcurrentLoadError(RaylogError):
    """The group's committed offsets moved while an incremental load ran
    (``raylog_spark.load_incremental``), or while a stream of
    :func:`raylog.read.stream.read_raylog_stream` held a batch; its offsets
    were not stored. Run the load (or stream) again (it starts from the new
    offsets)."""


@_code(72)
class FaultInjectionError(RaylogError, AssertionError):
    """A fault of the test kit (:mod:`raylog.testing.faults`) did not happen,
    or the client did not recover, in time. An ``AssertionError`` too, so a
    test reports it as a failure; check the kit's preconditions."""


@_code(80)  # a code apart from the run of 70s that other errors take
class DataDirInUseError(RaylogError):
    """Another running process owns the data directory (its embedded
    ZooKeeper and partition logs): close that process's client first, or
    pass another ``data_dir``. Not retriable: the owner holds it until it
    closes or exits (a dead owner's lock is gone with it)."""


# -- mirroring (raylog.mirror) -------------------------------------------------


@_code(120)
class MirrorSourceError(RaylogError):
    """The mirror's source cluster could not be reached or refused the token;
    check --source-zookeeper, --source-cluster and the source's token."""


@_code(121)
class MirrorNoTopicsError(RaylogError):
    """The mirror's topic pattern matches no topic of the source; check the
    regular expression (it must match whole names) or create the topics first."""


@_code(122)
class MirrorTopicMismatchError(RaylogError):
    """A target topic exists with another partition count than its source
    topic; delete it, or mirror under another name with --rename."""


@_code(123)
class MirrorNotFoundError(RaylogError):
    """No mirror of that name runs in this cluster; list them with
    ``raylog mirror status``."""


@_code(124)
class MirrorFormatError(RaylogError):
    """The mirror met format-2 record batches (docs/design.md §2), which it
    does not copy yet: written again as format 1 they would lose their
    headers and null values. Nothing of the set holding them was sent or
    recorded; the mirror stays at its position and copies on from there once
    it runs a raylog that copies format 2. (Raised by earlier versions only:
    the mirror now copies format 2; the code stays reserved for the name.)"""


# -- consumer pools (raylog.pool) ----------------------------------------------


@_code(150)
class PoolNotFoundError(RaylogError):
    """No consumer pool of that group runs in this cluster; start one with
    ``client.consumer_pool(...)`` (or check the group and ``--cluster``)."""


@_code(151)
class PoolExistsError(RaylogError):
    """A consumer pool of that group already runs in this cluster; stop it
    (``PoolHandle.stop``) or scale it (``PoolHandle.scale``) instead."""


# -- transactions: the coordinator (docs/design.md section 6; codes 180-189) --------


@_code(180)
class TransactionError(RaylogError):
    """The transaction coordinator refused a transactional call
    (:mod:`raylog.zk.transaction_states`); the subclass says why and what
    to do next. Nothing of the refused call was recorded."""


@_code(181)
class ProducerFencedError(TransactionError):
    """Another producer started with the same ``transactional_id`` (its
    start bumped the producer epoch): this one is a zombie, and every call
    of its epoch is refused from now on, its sends and commits included.
    Close it; only the newest producer of a transactional id may go on."""


@_code(182)
class InvalidProducerEpochError(TransactionError):
    """The producer epoch of the call is not the transaction's current one
    for a reason other than a newer producer: the coordinator aborted the
    transaction when it passed its timeout (and bumped the epoch), or the
    epoch was never handed out. Nothing of the call was recorded; start the
    producer again (``init_producer_id``) to get the current epoch.

    A partition raises it too for a transactional batch or marker of an
    older epoch than it has seen for the producer id (``producer_id``,
    ``epoch``, ``current_epoch``): nothing of it was stored."""


@_code(183)
class InvalidTxnStateError(TransactionError):
    """The call does not fit the transaction's state: a commit of a
    transaction that is aborting or aborted (or the reverse), an end of a
    transaction that never began, a write to a partition the transaction
    did not add. ``state`` names the state found. The transaction is as it
    was; abort it, or begin a new one.

    A partition raises it too (``producer_id``): a transactional batch of a
    transaction the coordinator has not added the partition to (KIP-890's
    check), or a plain batch while the producer's transaction is open;
    nothing of it was stored."""


@_code(184)
class ConcurrentTransactionsError(TransactionError):
    """The transactional id's previous transaction is still being
    completed (its commit or abort markers are being written); retry
    shortly: the call succeeds once the completion is recorded."""

    retriable = True


@_code(185)
class InvalidProducerIdMappingError(TransactionError):
    """The producer id of the call is not the one the coordinator holds for
    the transactional id (or the id has no producer yet): call
    ``init_producer_id`` with the transactional id first and use the id and
    epoch it returns."""


@_code(186)
class TransactionStateConflictError(TransactionError):
    """A transaction record in ZooKeeper changed since it was read (its
    version moved: another coordinator wrote it): the write was refused by
    ZooKeeper's compare-and-set and nothing was changed. Read the record
    again and decide again (the coordinator does this by itself)."""

    retriable = True


@_code(187)
class InvalidTransactionTimeoutError(ConfigError):
    """A transaction timeout is not a whole number of milliseconds between 1
    and the coordinator's maximum (``limit``); nothing was recorded. Pass a
    ``transaction_timeout_ms`` in that range."""


@_code(188)
class ProducerIdsExhaustedError(TransactionError):
    """The ZooKeeper node ``producer-ids`` cannot hand out another block:
    its next id is past the largest producer id (2**63 - 1), or it does not
    hold a block record at all (``path``, ``found``). Nothing was taken;
    repair the node by hand (it must only ever grow)."""


#: every error class (what ``from raylog.errors import *`` gives ``raylog``)
__all__ = [name for name, obj in list(globals().items())
           if isinstance(obj, type) and issubclass(obj, RaylogError)]
