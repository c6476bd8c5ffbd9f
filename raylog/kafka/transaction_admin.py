"""Kafka's listings of transactions and producers on raylog's state:
ListTransactions and DescribeTransactions on the transaction records,
DescribeProducers on the partitions' producer state (docs/design.md
sections 6 and 10), what ``kafka-transactions --list / --describe /
describe-producers`` and the admin clients send.

Both read the records of ``transactions/<transactional id>`` in ZooKeeper
(:class:`raylog.zk.transactions.TransactionStore`), which every listener
sees whole. States are Kafka's names, which raylog's records use as they
are (``Empty``, ``Ongoing``, ``PrepareCommit``, ``PrepareAbort``,
``CompleteCommit``, ``CompleteAbort``).

* **ListTransactions** (versions 0-1): a Kafka admin client asks every
  broker and joins the answers, so each listener lists the transactional
  ids it would coordinate as a group's coordinator
  (:meth:`~raylog.kafka.coordinator.Coordinator.coordinates`: one listener
  per id, by a hash over the listeners registered); a client that asks
  every listener sees each id once. Filters: states (a name not among
  Kafka's is answered in ``unknown_state_filters``), producer ids, and from
  version 1 a duration (only transactions ``Ongoing`` longer than that, in
  ms). Version 2's regular expression of ids is not served (a pattern a
  client chooses would be run here).
* **DescribeTransactions** (version 0): each named id's state, producer id
  and epoch, timeout, the start time of its current or last transaction
  (-1 when none began) and partitions; an id without a record is TRANSACTIONAL_ID_NOT_FOUND. Any
  listener answers (FindCoordinator names the listener asked for a
  transactional id, :mod:`raylog.kafka.transactions`).

* **DescribeProducers** (version 0): per partition, the idempotent and
  transactional producers its leader's log remembers
  (:meth:`raylog.storage.log.PartitionLog.active_producers`, asked of the
  partition's actor through Ray): producer id, epoch, last sequence and the
  first offset of its open transaction (-1: none). The last timestamp and
  the coordinator epoch are not kept per producer and answer -1. A
  partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION; one not
  served now, or whose actor does not answer within
  :data:`PRODUCERS_WAIT_S`, NOT_LEADER_OR_FOLLOWER (the client asks again).

**Bounds.** A request naming more than :data:`MAX_IDS` ids, states,
producer ids or partitions closes the connection (:class:`~raylog.kafka.frames.BadFrame`)
before any ZooKeeper read; served only after authentication.

Thread-safety: the functions keep no state.
"""

from __future__ import annotations

import logging
import time

from kafka.protocol.admin import DescribeProducersResponse, DescribeTransactionsResponse, ListTransactionsResponse

from raylog.config import NAMESPACE
from raylog.errors import RaylogError, UnknownTopicError
from raylog.kafka.frames import BadFrame
from raylog.zk.transactions import TransactionStore

log = logging.getLogger(__name__)

# Kafka error codes
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_NOT_AVAILABLE = 15
TRANSACTIONAL_ID_NOT_FOUND = 105

#: the most ids, states, producer ids or partitions one request may name
MAX_IDS = 1000
#: how long DescribeProducers waits for the partitions' actors to answer
PRODUCERS_WAIT_S = 10.0
#: Kafka's transaction states (org.apache.kafka.clients.admin.TransactionState)
KAFKA_STATES = ("Ongoing", "PrepareAbort", "PrepareCommit", "CompleteAbort", "CompleteCommit", "Empty",
                "PrepareEpochFence")


def _bound(what: str, count: int) -> None:
    if count > MAX_IDS:
        raise BadFrame(f"a request naming {count} {what} (at most {MAX_IDS} are served in one request)")


def list_transactions(backend, body, version: int):
    """The transactions of the ids this listener lists (module docstring)."""
    states = list(body.state_filters or [])
    producer_ids = list(body.producer_id_filters or [])
    _bound("states", len(states))
    _bound("producer ids", len(producer_ids))
    duration = body.duration_filter if version >= 1 else -1
    unknown = [s for s in states if s not in KAFKA_STATES]
    wanted_states, wanted_ids = set(states), set(producer_ids)
    Listed = ListTransactionsResponse.TransactionState
    now_ms = int(time.time() * 1000)
    try:
        listed = []
        for tid, record, _version in TransactionStore(backend.zk, backend.paths).records():
            if not backend.coordinator.coordinates(tid):
                continue
            if wanted_states and record.state not in wanted_states:
                continue
            if wanted_ids and record.producer_id not in wanted_ids:
                continue
            if duration is not None and duration >= 0 and not (
                    record.state == "Ongoing" and record.started_ms >= 0 and now_ms - record.started_ms > duration):
                continue
            listed.append(Listed(transactional_id=tid, producer_id=record.producer_id,
                                 transaction_state=record.state))
    except RaylogError as err:
        log.warning("ListTransactions: reading the transaction records failed: %s", err)
        return ListTransactionsResponse[version](throttle_time_ms=0, error_code=COORDINATOR_NOT_AVAILABLE,
                                                 unknown_state_filters=[], transaction_states=[])
    return ListTransactionsResponse[version](throttle_time_ms=0, error_code=NONE, unknown_state_filters=unknown,
                                             transaction_states=listed)


def describe_transactions(backend, body, version: int):
    """Each named transactional id's record (module docstring)."""
    ids = list(body.transactional_ids or [])
    _bound("transactional ids", len(ids))
    Described = DescribeTransactionsResponse.TransactionState
    Topic = Described.TopicData
    store = TransactionStore(backend.zk, backend.paths)
    out = []
    for tid in ids:
        try:
            found = store.read(tid)
        except RaylogError as err:
            log.warning("DescribeTransactions: reading the record of %r failed: %s", tid, err)
            out.append(_empty(Described, tid, COORDINATOR_NOT_AVAILABLE))
            continue
        if found is None:
            out.append(_empty(Described, tid, TRANSACTIONAL_ID_NOT_FOUND))
            continue
        record = found[0]
        by_topic: dict[str, list[int]] = {}
        for topic, partition in record.partitions:
            by_topic.setdefault(topic, []).append(partition)
        out.append(Described(
            error_code=NONE, transactional_id=tid, transaction_state=record.state,
            transaction_timeout_ms=record.timeout_ms,
            transaction_start_time_ms=record.started_ms,
            producer_id=record.producer_id, producer_epoch=record.producer_epoch,
            topics=[Topic(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())]))
    return DescribeTransactionsResponse[version](throttle_time_ms=0, transaction_states=out)


def _empty(Described, tid: str, code: int):
    return Described(error_code=code, transactional_id=tid, transaction_state="", transaction_timeout_ms=0,
                     transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1, topics=[])


def describe_producers(backend, body, version: int):
    """Each named partition's active producers (module docstring)."""
    import ray  # heavy (Ray): imported when used

    topics = list(body.topics or [])
    _bound("partitions", sum(len(t.partition_indexes or ()) for t in topics) + len(topics))
    TopicOut = DescribeProducersResponse.TopicResponse
    PartitionOut = TopicOut.PartitionResponse
    Producer = PartitionOut.ProducerState
    asked, answers = [], {}
    registry = backend.metadata.registry
    for topic in topics:
        try:
            count = registry.topic_config(topic.name).partitions
            endpoints = registry.endpoints(topic.name)
        except UnknownTopicError:
            count, endpoints = 0, {}
        except RaylogError as err:
            log.warning("DescribeProducers: reading %s failed: %s", topic.name, err)
            count, endpoints = None, {}
        for p in topic.partition_indexes or ():
            key = (topic.name, p)
            if count is not None and not 0 <= p < count:
                answers[key] = (UNKNOWN_TOPIC_OR_PARTITION, f"{topic.name}-{p} does not exist")
                continue
            endpoint = endpoints.get(p)
            if endpoint is None or not endpoint.get("actor"):
                answers[key] = (NOT_LEADER_OR_FOLLOWER, f"{topic.name}-{p} is not served now")
                continue
            try:
                actor = ray.get_actor(endpoint["actor"], namespace=NAMESPACE)
                asked.append((key, actor.active_producers.remote()))
            except ValueError:
                answers[key] = (NOT_LEADER_OR_FOLLOWER, f"{topic.name}-{p} is not served now")
    if asked:
        ready, _ = ray.wait([ref for _, ref in asked], num_returns=len(asked), timeout=PRODUCERS_WAIT_S)
        ready = set(ready)
        for key, ref in asked:
            try:
                if ref not in ready:
                    raise TimeoutError(f"no answer within {PRODUCERS_WAIT_S:g} s")
                answers[key] = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - that partition's answer only
                answers[key] = (NOT_LEADER_OR_FOLLOWER, f"{key[0]}-{key[1]}: {type(err).__name__}: {err}"[:200])
    out = []
    for topic in topics:
        partitions = []
        for p in topic.partition_indexes or ():
            found = answers[(topic.name, p)]
            if isinstance(found, tuple):
                partitions.append(PartitionOut(partition_index=p, error_code=found[0], error_message=found[1],
                                               active_producers=[]))
                continue
            partitions.append(PartitionOut(partition_index=p, error_code=NONE, error_message=None, active_producers=[
                Producer(producer_id=f["producer_id"], producer_epoch=f["epoch"], last_sequence=f["last_sequence"],
                         last_timestamp=-1, coordinator_epoch=-1, current_txn_start_offset=f["transaction_start"])
                for f in found]))
        out.append(TopicOut(name=topic.name, partitions=partitions))
    return DescribeProducersResponse[version](throttle_time_ms=0, topics=out)
