"""Kafka's transaction listings on raylog's transaction records:
ListTransactions and DescribeTransactions (docs/design.md sections 6 and
10), what ``kafka-transactions --list / --describe`` and the admin clients
send.

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

**Bounds.** A request naming more than :data:`MAX_IDS` ids, states or
producer ids closes the connection (:class:`~raylog.kafka.frames.BadFrame`)
before any ZooKeeper read; served only after authentication.

Thread-safety: the functions keep no state.
"""

from __future__ import annotations

import logging
import time

from kafka.protocol.admin import DescribeTransactionsResponse, ListTransactionsResponse

from raylog.errors import RaylogError
from raylog.kafka.frames import BadFrame
from raylog.zk.transactions import TransactionStore

log = logging.getLogger(__name__)

# Kafka error codes
NONE = 0
COORDINATOR_NOT_AVAILABLE = 15
TRANSACTIONAL_ID_NOT_FOUND = 105

#: the most ids, states or producer ids one request may name
MAX_IDS = 1000
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
