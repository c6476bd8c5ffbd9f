"""The transaction coordinator's state machine, as pure transitions of a
transaction record (:class:`raylog.zk.transactions.TransactionRecord`).

Each function takes the record a coordinator read (None: the transactional
id has none) and the call's arguments, and returns a :class:`Step`: the
record to write (with a compare-and-set on the version read), the answer,
and the markers to write; or it raises the typed error of a refused call,
with nothing to write. No ZooKeeper, no Ray, no clock (``now_ms`` is an
argument): the coordinator's actor (:mod:`raylog.actors.transaction_coordinator`)
reads, calls, writes and writes markers; the property tests drive it
against a model.

It lives here, beside the record it transforms, rather than with the
actor: the actor is in ``actors/``, which the clients that will drive the
coordinator (``producer/``, ``kafka/``) may not import, and they need the
states and the answers too.

States (Kafka's ``TransactionState``)::

    (none) --init--> Empty --add--> Ongoing --end(commit)--> PrepareCommit --markers--> CompleteCommit
                       ^              |  |  \\--end(abort)--> PrepareAbort --markers--> CompleteAbort
                       |              |  \\--timeout---------^   ^
                       |              \\--init (fence)-----------/
                       +--init-- Empty, CompleteCommit, CompleteAbort (epoch bump)
    CompleteCommit, CompleteAbort --add--> Ongoing (the next transaction)

* ``init_producer_id``: a new transactional id gets a producer id and epoch
  0; a known one gets its epoch bumped, which **fences** every holder of an
  older epoch (a zombie: :class:`~raylog.errors.ProducerFencedError`). An
  ``Ongoing`` transaction of the fenced epoch is aborted first (the step is
  ``PrepareAbort`` with ``init_again``: the coordinator completes the abort
  and calls ``init_producer_id`` again). During ``Prepare*`` the answer is
  :class:`~raylog.errors.ConcurrentTransactionsError` (retriable).
* ``add_partitions`` / ``add_offsets``: join partitions or a consumer group
  (with the offsets to commit for it) to the transaction, starting it
  (``Ongoing``, ``started_ms``) if none is.
* ``end_transaction``: ``Ongoing`` to ``PrepareCommit`` / ``PrepareAbort``.
  As KIP-890 has it, **every end bumps the epoch**: the markers carry the
  bumped epoch, a late write of the ended transaction (its epoch, now old)
  is refused by the partition, and the answer is the producer's next
  identity. A retried end (the answer was lost) carries the epoch before
  the bump and is recognised by ``last_producer_id`` / ``last_epoch``.
  With ``bump=False`` (Kafka clients of "transaction version 1", which end
  through EndTxn below version 5 and keep their epoch afterwards: librdkafka,
  kafka-python) the end keeps the epoch, as Kafka does for them: the
  markers carry the transaction's own epoch, the answer is the same
  identity, and a retried end finds the transaction ``Complete*`` (answered
  as done) or still ``Prepare*`` (:class:`~raylog.errors.ConcurrentTransactionsError`).
  Fencing is unchanged: ``init_producer_id`` and ``expire`` bump.
* ``expire``: an ``Ongoing`` transaction past ``started_ms + timeout_ms`` goes
  to ``PrepareAbort`` (epoch bumped: its producer's later calls are told
  :class:`~raylog.errors.InvalidProducerEpochError`, its abort is answered as
  done).
* ``complete``: ``Prepare*`` to ``Complete*``, once the markers are written
  (and, for a commit, with the group offsets in the same ZooKeeper
  transaction). A coordinator that starts finishes every ``Prepare*`` it
  finds: the decision is the record, so a commit is never lost to a crash.
* ``verify_partition``: KIP-890's check for the partition: before it takes
  the first transactional batch of a producer's transaction, it asks
  whether the transaction is ``Ongoing`` with that partition added, by that
  producer id and epoch.

Not kept from Kafka: ``PrepareEpochFence`` (Kafka's in-memory state while
the bumped epoch is logged; here the bump and ``PrepareAbort`` are one
compare-and-set) and ``Dead`` (expiring idle transactional ids is not built).

The epoch handed to a producer stays below ``MAX_EPOCH - 1``, so that the
markers of its transaction (one more) and a fence's abort (one more) fit an
i16; the bump that would reach it moves the producer to a new producer id
with epoch 0 instead (``next_producer_id``, taken at the end; the new id is
in use once the transaction completes).

Pure functions and immutable values; any thread.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping

from raylog.errors import (
    ConcurrentTransactionsError,
    ConfigError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from raylog.zk.transactions import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    PREPARED,
    TransactionRecord,
)

#: the largest producer epoch (a batch's producerEpoch is an i16)
MAX_EPOCH = (1 << 15) - 1
#: the longest transaction timeout a producer may ask for (Kafka's
#: ``transaction.max.timeout.ms`` default: 15 minutes)
MAX_TIMEOUT_MS = 15 * 60 * 1000


@dataclasses.dataclass(frozen=True)
class Markers:
    """The commit or abort markers to write to every partition of a
    prepared transaction: a control batch of ``producer_id`` with
    ``producer_epoch`` (the bumped epoch) on each partition."""

    partitions: tuple[tuple[str, int], ...]
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclasses.dataclass(frozen=True)
class Step:
    """What a call does: ``record`` to write (None: nothing changes),
    ``reply`` the ``(producer_id, producer_epoch)`` the producer holds from now
    on (None for calls that answer nothing), ``markers`` to write before the
    transaction completes (None: none), and ``init_again`` for an
    ``init_producer_id`` that had to abort an ongoing transaction first."""

    record: TransactionRecord | None = None
    reply: tuple[int, int] | None = None
    markers: Markers | None = None
    init_again: bool = False


def markers_of(record: TransactionRecord) -> Markers | None:
    """The markers a prepared record still needs written (None unless ``Prepare*``)."""
    if record.state not in PREPARED:
        return None
    return Markers(record.partitions, record.producer_id, record.producer_epoch, record.state == PREPARE_COMMIT)


def next_identity(record: TransactionRecord) -> tuple[int, int]:
    """The ``(producer_id, producer_epoch)`` the producer holds once the
    record's transaction has ended (the identity after a rotation, if one is
    due)."""
    if record.next_producer_id >= 0:
        return record.next_producer_id, 0
    return record.producer_id, record.producer_epoch


def check_timeout(timeout_ms, max_timeout_ms: int = MAX_TIMEOUT_MS) -> int:
    if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or not 1 <= timeout_ms <= max_timeout_ms:
        raise InvalidTransactionTimeoutError(
            f"a transaction timeout is 1 to {max_timeout_ms} ms, got {timeout_ms!r}", limit=max_timeout_ms)
    return timeout_ms


def _bumped(record: TransactionRecord, epoch: int, new_producer_id: Callable[[], int]) -> tuple[int, int]:
    """The producer's identity after a bump to ``epoch``: a new producer id
    with epoch 0 when ``epoch`` reaches ``MAX_EPOCH - 1``."""
    if epoch >= MAX_EPOCH - 1:
        return new_producer_id(), 0
    return record.producer_id, epoch


# ----------------------------------------------------------------------------
# the producer's identity


def _refuse_identity(record: TransactionRecord | None, transactional_id: str, producer_id: int,
                     epoch: int, what: str) -> None:
    """Raise the typed error of a call whose ``(producer_id, epoch)`` is not
    the record's current one; return when it is."""
    if record is None:
        raise InvalidProducerIdMappingError(
            f"cannot {what}: transactional id {transactional_id!r} has no producer yet; call "
            f"init_producer_id first", transactional_id=transactional_id)
    if producer_id == record.producer_id and epoch == record.producer_epoch:
        return
    if producer_id == record.last_producer_id and epoch == record.last_epoch:
        if record.timed_out:
            raise InvalidProducerEpochError(
                f"cannot {what}: the transaction of {transactional_id!r} with producer epoch {epoch} was "
                f"aborted by the coordinator when it passed its timeout ({record.timeout_ms} ms); nothing "
                f"of this call was recorded: start the producer again (init_producer_id)",
                transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch)
        _fenced(transactional_id, producer_id, epoch, what)
    if producer_id != record.producer_id:
        raise InvalidProducerIdMappingError(
            f"cannot {what}: producer id {producer_id} is not the producer id of transactional id "
            f"{transactional_id!r}; call init_producer_id and use the id it returns",
            transactional_id=transactional_id, producer_id=producer_id)
    if epoch > record.producer_epoch:
        raise InvalidProducerEpochError(
            f"cannot {what}: producer epoch {epoch} of {transactional_id!r} was never handed out (the "
            f"current one is {record.producer_epoch}); start the producer again (init_producer_id)",
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch)
    _fenced(transactional_id, producer_id, epoch, what)


def _fenced(transactional_id: str, producer_id: int, epoch: int, what: str):
    raise ProducerFencedError(
        f"cannot {what}: a newer producer with transactional id {transactional_id!r} started (producer "
        f"{producer_id} epoch {epoch} is fenced); nothing of this call was recorded: close this producer",
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch)


def _concurrent(transactional_id: str, record: TransactionRecord, what: str):
    raise ConcurrentTransactionsError(
        f"cannot {what}: the previous transaction of {transactional_id!r} is being completed "
        f"({record.state}); retry shortly", transactional_id=transactional_id, state=record.state)


# ----------------------------------------------------------------------------
# the calls


def init_producer_id(record: TransactionRecord | None, transactional_id: str, *, timeout_ms: int, now_ms: int,
                     new_producer_id: Callable[[], int], max_timeout_ms: int = MAX_TIMEOUT_MS) -> Step:
    """A producer with ``transactional_id`` starts (see the module docstring)."""
    check_timeout(timeout_ms, max_timeout_ms)
    if record is None:
        fresh = TransactionRecord(producer_id=new_producer_id(), producer_epoch=0, state=EMPTY,
                                  timeout_ms=timeout_ms, updated_ms=now_ms)
        return Step(record=fresh, reply=(fresh.producer_id, 0))
    if record.state in PREPARED:
        _concurrent(transactional_id, record, "start a producer")
    if record.state == ONGOING:
        # fence: abort the fenced epoch's transaction, with a bumped epoch
        aborting = _prepare(record, commit=False, now_ms=now_ms, new_producer_id=new_producer_id,
                            last=(-1, -1), timed_out=False)
        return Step(record=aborting, markers=markers_of(aborting), init_again=True)
    pid, epoch = _bumped(record, record.producer_epoch + 1, new_producer_id)
    ready = dataclasses.replace(
        record, producer_id=pid, producer_epoch=epoch, state=EMPTY, timeout_ms=timeout_ms, partitions=(),
        groups=(), started_ms=-1, updated_ms=now_ms, last_producer_id=-1, last_epoch=-1, next_producer_id=-1,
        timed_out=False)
    return Step(record=ready, reply=(pid, epoch))


def _check_partitions(partitions) -> list[tuple[str, int]]:
    out = []
    for item in partitions:
        try:
            topic, partition = item
        except (TypeError, ValueError):
            raise ConfigError(f"a transaction's partition is (topic, partition), got {item!r}") from None
        if not isinstance(topic, str) or not topic or not isinstance(partition, int) or isinstance(
                partition, bool) or partition < 0:
            raise ConfigError(f"a transaction's partition is (topic: non-empty str, partition: int >= 0), "
                              f"got {item!r}")
        out.append((topic, partition))
    return out


def _begin(record: TransactionRecord, now_ms: int) -> TransactionRecord:
    if record.state == ONGOING:
        return record
    return dataclasses.replace(record, state=ONGOING, started_ms=now_ms, partitions=(), groups=())


def add_partitions(record: TransactionRecord | None, transactional_id: str, producer_id: int, epoch: int,
                   partitions: Iterable[tuple[str, int]], *, now_ms: int) -> Step:
    """Partitions join the transaction (it begins if none is ongoing)."""
    wanted = _check_partitions(partitions)
    what = f"add partitions {wanted} to the transaction"
    _refuse_identity(record, transactional_id, producer_id, epoch, what)
    if record.state in PREPARED:
        _concurrent(transactional_id, record, what)
    if record.state == ONGOING and set(wanted) <= set(record.partitions):
        return Step()
    grown = _begin(record, now_ms).with_partitions(wanted)
    return Step(record=dataclasses.replace(grown, updated_ms=now_ms))


def add_offsets(record: TransactionRecord | None, transactional_id: str, producer_id: int, epoch: int,
                group: str, offsets: Mapping[tuple[str, int], int] | None = None, *, now_ms: int) -> Step:
    """A consumer group joins the transaction, with the offsets it commits
    (``{(topic, partition): next offset}``, merged with earlier ones); they
    become the group's committed offsets when the transaction commits."""
    if not isinstance(group, str) or not group or "/" in group:
        raise ConfigError(f"a consumer group is a non-empty str without '/', got {group!r}")
    offsets = dict(offsets or {})
    _check_partitions(offsets)
    for tp, offset in offsets.items():
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigError(f"an offset is a non-negative int (a byte position), got {offset!r} for {tp}")
    what = f"add the offsets of group {group!r} to the transaction"
    _refuse_identity(record, transactional_id, producer_id, epoch, what)
    if record.state in PREPARED:
        _concurrent(transactional_id, record, what)
    grown = _begin(record, now_ms).with_group(group, offsets)
    if grown == record:
        return Step()
    return Step(record=dataclasses.replace(grown, updated_ms=now_ms))


def _prepare(record: TransactionRecord, *, commit: bool, now_ms: int, new_producer_id: Callable[[], int],
             last: tuple[int, int], timed_out: bool, bump: bool = True) -> TransactionRecord:
    """``Ongoing`` to ``Prepare*`` with the epoch bumped (the markers'
    epoch); with ``bump=False`` the epoch stays (the markers carry it)."""
    if not bump:
        return dataclasses.replace(
            record, state=PREPARE_COMMIT if commit else PREPARE_ABORT, updated_ms=now_ms,
            last_producer_id=last[0], last_epoch=last[1], next_producer_id=-1, timed_out=timed_out)
    marker_epoch = record.producer_epoch + 1
    next_pid, _ = _bumped(record, marker_epoch, new_producer_id)
    return dataclasses.replace(
        record, state=PREPARE_COMMIT if commit else PREPARE_ABORT, producer_epoch=marker_epoch,
        updated_ms=now_ms, last_producer_id=last[0], last_epoch=last[1],
        next_producer_id=next_pid if next_pid != record.producer_id else -1, timed_out=timed_out)


def end_transaction(record: TransactionRecord | None, transactional_id: str, producer_id: int, epoch: int,
                    commit: bool, *, now_ms: int, new_producer_id: Callable[[], int], bump: bool = True) -> Step:
    """The producer commits or aborts its transaction (see the module
    docstring); ``bump=False``: the epoch stays (a Kafka client of
    transaction version 1)."""
    verb = "commit" if commit else "abort"
    what = f"{verb} the transaction"
    done = (PREPARE_COMMIT, COMPLETE_COMMIT) if commit else (PREPARE_ABORT, COMPLETE_ABORT)
    other = (PREPARE_ABORT, COMPLETE_ABORT) if commit else (PREPARE_COMMIT, COMPLETE_COMMIT)
    if (record is not None and (producer_id, epoch) == (record.last_producer_id, record.last_epoch)
            and (producer_id, epoch) != (record.producer_id, record.producer_epoch)):
        # the end of the last transaction again: a retry whose answer was lost
        if record.state in done:
            return Step(reply=next_identity(record))
        if record.state in other and not record.timed_out:
            raise InvalidTxnStateError(
                f"cannot {what} of {transactional_id!r}: it was already "
                f"{'aborted' if commit else 'committed'} ({record.state})",
                transactional_id=transactional_id, state=record.state)
    _refuse_identity(record, transactional_id, producer_id, epoch, what)
    if record.state == ONGOING:
        # without a bump, the identity is the current one: no retry to tell by it
        prepared = _prepare(record, commit=commit, now_ms=now_ms, new_producer_id=new_producer_id,
                            last=(producer_id, epoch) if bump else (-1, -1), timed_out=False, bump=bump)
        return Step(record=prepared, reply=next_identity(prepared), markers=markers_of(prepared))
    if record.state in PREPARED:
        _concurrent(transactional_id, record, what)
    if not bump and record.state == done[1]:
        # the end again, its answer lost (Kafka's answer to transaction version 1)
        return Step(reply=next_identity(record))
    raise InvalidTxnStateError(
        f"cannot {what} of {transactional_id!r}: no transaction is ongoing ({record.state}); begin one by "
        f"adding partitions or offsets first", transactional_id=transactional_id, state=record.state)


def expire(record: TransactionRecord, *, now_ms: int, new_producer_id: Callable[[], int]) -> Step:
    """An ``Ongoing`` transaction past its timeout is aborted (no step otherwise)."""
    if record.state != ONGOING or now_ms < record.started_ms + record.timeout_ms:
        return Step()
    aborting = _prepare(record, commit=False, now_ms=now_ms, new_producer_id=new_producer_id,
                        last=(record.producer_id, record.producer_epoch), timed_out=True)
    return Step(record=aborting, markers=markers_of(aborting))


def complete(record: TransactionRecord, *, now_ms: int) -> TransactionRecord:
    """The record once a prepared transaction's markers are written:
    ``Complete*``, the producer at its next identity. (A commit's group
    offsets are written with it: ``record.group_offsets`` of the prepared
    record.)"""
    if record.state not in PREPARED:
        raise InvalidTxnStateError(f"only a prepared transaction completes, this one is {record.state}",
                                   state=record.state)
    pid, epoch = next_identity(record)
    return dataclasses.replace(
        record, state=COMPLETE_COMMIT if record.state == PREPARE_COMMIT else COMPLETE_ABORT, producer_id=pid,
        producer_epoch=epoch, partitions=(), groups=(), started_ms=-1, updated_ms=now_ms, next_producer_id=-1)


def verify_partition(record: TransactionRecord | None, transactional_id: str, producer_id: int, epoch: int,
                     topic: str, partition: int) -> None:
    """KIP-890's check, asked by a partition before it accepts the first
    transactional batch of a transaction: returns when the transaction of
    ``producer_id``/``epoch`` is ``Ongoing`` with ``topic``/``partition``
    added, else raises (the batch must be refused)."""
    what = f"write to {topic}/{partition} in a transaction"
    _refuse_identity(record, transactional_id, producer_id, epoch, what)
    if record.state != ONGOING or (topic, partition) not in record.partitions:
        raise InvalidTxnStateError(
            f"cannot {what}: the transaction of {transactional_id!r} did not add that partition "
            f"({record.state}); add it (add_partitions) before writing", transactional_id=transactional_id,
            state=record.state)
