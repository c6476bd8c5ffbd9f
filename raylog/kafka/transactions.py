"""Kafka's transaction APIs on the front door (docs/design.md sections 6
and 10): FindCoordinator for a transactional id (key type 1),
InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn and TxnOffsetCommit, each one call of the cluster's
transaction coordinator (the actor named :func:`raylog.config.coordinator_name`,
reached by its name through Ray: ``raylog/kafka`` does not import
``raylog/actors``), which keeps the transaction's state in ZooKeeper.

* **Coordinator.** Every listener answers FindCoordinator for a
  transactional id with itself (it relays to the one coordinator actor),
  once that actor runs; it is started by ``client.transaction_coordinator()``
  or by raylog's first transactional producer. While none runs the answer
  is COORDINATOR_NOT_AVAILABLE (retriable: the client asks again), saying
  how to start it.
* **InitProducerId** with a transactional id: the coordinator's
  ``init_producer_id`` with the request's transaction timeout; a known id
  gets its epoch bumped, fencing the older producer (an ongoing transaction
  of it is aborted first). A request naming the identity it holds (version
  3 and later, KIP-360) is refused as fenced unless it is the current one.
* **AddPartitionsToTxn** (versions 0-3): the partitions join the
  transaction; a partition of an unknown topic, or past the topic's count,
  is UNKNOWN_TOPIC_OR_PARTITION and the others of the request
  OPERATION_NOT_ATTEMPTED (nothing is added), as Kafka answers.
* **AddOffsetsToTxn** joins the group to the transaction (no offsets yet);
  **TxnOffsetCommit** hands the coordinator the group's offsets (raylog
  offsets: a Kafka offset is the raylog offset), held in the transaction's
  record and written as the group's committed offsets with the commit, in
  the same ZooKeeper transaction as its completion; an abort drops them.
* **EndTxn** (versions 0-4): commit or abort. These versions are Kafka's
  "transaction version 1": the client keeps its epoch after the end
  (librdkafka, kafka-python), so the coordinator ends the transaction
  without bumping the epoch (``bump=False``; its markers carry the
  transaction's epoch). EndTxn 5 (KIP-890's bump per transaction) is not
  served, so no client asks for it.

Transactional batches of a Produce are stored as they come
(:mod:`raylog.kafka.records`; the partition tracks the transaction and
takes the coordinator's markers).

Errors: the coordinator's typed errors become Kafka's codes
(:func:`error_code`): :class:`~raylog.errors.ProducerFencedError`
PRODUCER_FENCED (INVALID_PRODUCER_EPOCH below version 2 of the API, whose
clients do not know the newer code, as Kafka does),
:class:`~raylog.errors.InvalidProducerEpochError` INVALID_PRODUCER_EPOCH,
:class:`~raylog.errors.InvalidTxnStateError` INVALID_TXN_STATE,
:class:`~raylog.errors.ConcurrentTransactionsError` CONCURRENT_TRANSACTIONS
(the client retries), :class:`~raylog.errors.InvalidProducerIdMappingError`
INVALID_PRODUCER_ID_MAPPING,
:class:`~raylog.errors.InvalidTransactionTimeoutError`
INVALID_TRANSACTION_TIMEOUT, another :class:`~raylog.errors.ConfigError`
INVALID_REQUEST, a coordinator that is not running, restarting or slow
(and any other retriable error) COORDINATOR_NOT_AVAILABLE, the rest
UNKNOWN_SERVER_ERROR. Every refusal is logged with raylog's message.

Thread-safety: :class:`CoordinatorLink` caches the actor's handle under a
lock and is shared by a listener's sessions; the handlers keep no state.
"""

from __future__ import annotations

import logging
import threading

from kafka.protocol.metadata import FindCoordinatorResponse
from kafka.protocol.producer import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    TxnOffsetCommitResponse,
)

from raylog.config import NAMESPACE, coordinator_name
from raylog.errors import (
    BrokerUnavailableError,
    ConcurrentTransactionsError,
    ConfigError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    RaylogError,
)

log = logging.getLogger(__name__)

#: FindCoordinator's key type of a transactional id
TRANSACTION_KEY_TYPE = 1
#: how long one coordinator call may take (an end writes the markers meanwhile)
CALL_TIMEOUT_S = 45.0

# Kafka error codes
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
COORDINATOR_NOT_AVAILABLE = 15
INVALID_REQUEST = 42
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
OPERATION_NOT_ATTEMPTED = 55
PRODUCER_FENCED = 90
UNKNOWN_SERVER_ERROR = -1


def error_code(err: Exception, version: int, fenced_from: int = 2) -> int:
    """Kafka's code for a coordinator's refusal (see the module docstring);
    ``fenced_from``: the API's first version that knows PRODUCER_FENCED."""
    if isinstance(err, ProducerFencedError):
        return PRODUCER_FENCED if version >= fenced_from else INVALID_PRODUCER_EPOCH
    for kind, code in (
        (InvalidProducerEpochError, INVALID_PRODUCER_EPOCH),
        (InvalidTxnStateError, INVALID_TXN_STATE),
        (ConcurrentTransactionsError, CONCURRENT_TRANSACTIONS),
        (InvalidProducerIdMappingError, INVALID_PRODUCER_ID_MAPPING),
        (InvalidTransactionTimeoutError, INVALID_TRANSACTION_TIMEOUT),
        (ConfigError, INVALID_REQUEST),
        (BrokerUnavailableError, COORDINATOR_NOT_AVAILABLE),
    ):
        if isinstance(err, kind):
            return code
    if getattr(err, "retriable", False):
        return COORDINATOR_NOT_AVAILABLE
    return UNKNOWN_SERVER_ERROR


class CoordinatorLink:
    """The cluster's transaction coordinator actor, found by its name and
    called through Ray; its refusals raised as raylog's typed errors (not
    Ray's wrapper). Thread-safe: the handle is cached under a lock."""

    def __init__(self, cluster: str, timeout_s: float = CALL_TIMEOUT_S, start=None):
        self.cluster, self.timeout_s = cluster, timeout_s
        #: ``start()`` starts the coordinator and returns its handle (None: never started from here)
        self.start = start
        self._lock = threading.Lock()
        self._handle = None

    def find(self):
        """The coordinator's handle, or None when none runs (started first
        by :attr:`start` when given: a cluster runs a coordinator only once
        a transactional client needs it)."""
        import ray  # heavy (Ray): imported when used

        with self._lock:
            if self._handle is None:
                try:
                    self._handle = ray.get_actor(coordinator_name(self.cluster), namespace=NAMESPACE)
                except ValueError:
                    if self.start is None:
                        return None
                    try:
                        self._handle = self.start()
                    except Exception as err:  # noqa: BLE001 - told to retry, with the cause logged
                        log.warning("the transaction coordinator of %s could not be started: %s", self.cluster, err)
                        return None
            return self._handle

    def not_running(self) -> BrokerUnavailableError:
        return BrokerUnavailableError(
            f"cluster {self.cluster!r} has no transaction coordinator running; start it with "
            f"client.transaction_coordinator() (a raylog transactional producer starts it too)")

    def call(self, method: str, *args):
        """One call of the coordinator; raises its typed error, or a
        retriable :class:`BrokerUnavailableError` when it is not running or
        does not answer in time."""
        import ray  # heavy (Ray): imported when used

        handle = self.find()
        if handle is None:
            raise self.not_running()
        try:
            return ray.get(getattr(handle, method).remote(*args), timeout=self.timeout_s)
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)
            if isinstance(cause, RaylogError):
                raise cause from None
            raise RaylogError(f"the transaction coordinator failed {method}: {err}") from None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            with self._lock:
                self._handle = None  # look it up again next time (it may have been restarted)
            raise BrokerUnavailableError(f"the transaction coordinator did not answer {method} "
                                         f"({type(err).__name__}); retry") from None


def _refused(api: str, transactional_id, err: Exception, code: int) -> None:
    log.info("%s of transactional id %r answered %d: %s", api, transactional_id, code, str(err).splitlines()[0])


# ----------------------------------------------------------------------------
# the handlers


def find_coordinator(body, version: int, link: CoordinatorLink, entry: dict):
    """FindCoordinator for a transactional id: this listener, once the
    coordinator runs."""
    if link.find() is None:
        err = link.not_running()
        _refused("FindCoordinator", body.key, err, COORDINATOR_NOT_AVAILABLE)
        return FindCoordinatorResponse[version](
            throttle_time_ms=0, error_code=COORDINATOR_NOT_AVAILABLE, error_message=str(err), node_id=-1,
            host="", port=-1)
    return FindCoordinatorResponse[version](throttle_time_ms=0, error_code=NONE, error_message=None,
                                            node_id=entry["broker_id"], host=entry["host"], port=entry["port"])


def _check_held(link: CoordinatorLink, tid: str, held: tuple[int, int]) -> None:
    """KIP-360: a producer that names the identity it holds (version 3 and
    later: librdkafka's epoch bump after an abortable error) gets the bump
    only while that identity is the current one; an older one is fenced.
    (Checked before the call, not in the same compare-and-set: two
    producers of one id racing here are both bumped in turn, and the loser
    is fenced at its next call.)"""
    record = link.call("describe", tid)
    if record is None:
        raise InvalidProducerIdMappingError(
            f"transactional id {tid!r} has no producer, yet producer {held[0]} epoch {held[1]} was named; "
            f"start again without a producer id", transactional_id=tid)
    if (record["producer_id"], record["producer_epoch"]) != held:
        raise ProducerFencedError(
            f"producer {held[0]} epoch {held[1]} of transactional id {tid!r} is not the current one "
            f"(a newer producer started): close this producer", transactional_id=tid, producer_id=held[0],
            producer_epoch=held[1])


def init_producer_id(body, version: int, link: CoordinatorLink):
    """InitProducerId with a transactional id: the coordinator's identity
    (fencing an older producer of the id)."""
    tid = body.transactional_id
    try:
        if not tid:
            raise ConfigError("a transactional id is a non-empty string; leave it null for an idempotent "
                              "producer without transactions")
        held = (getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
        if held[0] is not None and held[0] >= 0:
            _check_held(link, tid, held)
        pid, epoch = link.call("init_producer_id", tid, body.transaction_timeout_ms)
        return InitProducerIdResponse[version](throttle_time_ms=0, error_code=NONE, producer_id=pid,
                                               producer_epoch=epoch)
    except RaylogError as err:
        code = error_code(err, version, fenced_from=4)
        _refused("InitProducerId", tid, err, code)
        return InitProducerIdResponse[version](throttle_time_ms=0, error_code=code, producer_id=-1,
                                               producer_epoch=-1)


def add_partitions(body, version: int, link: CoordinatorLink, registry):
    """AddPartitionsToTxn (versions 0-3)."""
    tid = body.v3_and_below_transactional_id
    wanted = [(t.name, list(t.partitions)) for t in body.v3_and_below_topics]
    unknown = set()
    for name, partitions in wanted:
        try:
            count = registry.topic_config(name).partitions
        except RaylogError:
            count = 0
        unknown.update((name, p) for p in partitions if not 0 <= p < count)
    if unknown:
        codes = {tp: UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else OPERATION_NOT_ATTEMPTED
                 for name, partitions in wanted for tp in ((name, p) for p in partitions)}
        log.info("AddPartitionsToTxn of transactional id %r refused: unknown partitions %s", tid, sorted(unknown))
    else:
        try:
            link.call("add_partitions", tid, body.v3_and_below_producer_id, body.v3_and_below_producer_epoch,
                      [(name, p) for name, partitions in wanted for p in partitions])
            code = NONE
        except RaylogError as err:
            code = error_code(err, version)
            _refused("AddPartitionsToTxn", tid, err, code)
        codes = {(name, p): code for name, partitions in wanted for p in partitions}
    Topic = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
    Partition = Topic.AddPartitionsToTxnPartitionResult
    results = [Topic(name=name, results_by_partition=[Partition(partition_index=p, partition_error_code=codes[
        (name, p)]) for p in partitions]) for name, partitions in wanted]
    return AddPartitionsToTxnResponse[version](throttle_time_ms=0, results_by_topic_v3_and_below=results)


def add_offsets(body, version: int, link: CoordinatorLink):
    """AddOffsetsToTxn: the group joins the transaction (its offsets come
    with TxnOffsetCommit)."""
    try:
        link.call("add_offsets", body.transactional_id, body.producer_id, body.producer_epoch, body.group_id, {})
        code = NONE
    except RaylogError as err:
        code = error_code(err, version)
        _refused("AddOffsetsToTxn", body.transactional_id, err, code)
    return AddOffsetsToTxnResponse[version](throttle_time_ms=0, error_code=code)


def txn_offset_commit(body, version: int, link: CoordinatorLink):
    """TxnOffsetCommit: the group's offsets, held by the transaction until
    it commits."""
    offsets = {(t.name, p.partition_index): p.committed_offset for t in body.topics for p in t.partitions}
    try:
        link.call("add_offsets", body.transactional_id, body.producer_id, body.producer_epoch, body.group_id,
                  offsets)
        code = NONE
    except RaylogError as err:
        code = error_code(err, version)
        _refused("TxnOffsetCommit", body.transactional_id, err, code)
    Topic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    Partition = Topic.TxnOffsetCommitResponsePartition
    topics = [Topic(name=t.name, partitions=[Partition(partition_index=p.partition_index, error_code=code)
                                             for p in t.partitions]) for t in body.topics]
    return TxnOffsetCommitResponse[version](throttle_time_ms=0, topics=topics)


def end_transaction(body, version: int, link: CoordinatorLink):
    """EndTxn (versions 0-4: the epoch stays, see the module docstring)."""
    try:
        link.call("end_transaction", body.transactional_id, body.producer_id, body.producer_epoch,
                  bool(body.committed), False)
        code = NONE
    except RaylogError as err:
        code = error_code(err, version)
        _refused("EndTxn", body.transactional_id, err, code)
    return EndTxnResponse[version](throttle_time_ms=0, error_code=code)
