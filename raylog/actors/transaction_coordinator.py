"""The transaction coordinator: one detached Ray actor per raylog cluster
(named ``<cluster>/transaction-coordinator`` in the ``raylog`` namespace, no
CPU, restarted by Ray), keeping every transactional producer's state in
ZooKeeper (docs/design.md sections 4 and 6).

Its calls (each is :mod:`raylog.zk.transaction_states`' transition of the same
name, read from ZooKeeper and written back with a compare-and-set):

* ``init_producer_id(transactional_id, timeout_ms) -> (producer_id, epoch)``:
  a new id from a ``producer-ids`` block, or the epoch bumped (fencing the
  older epoch; an ongoing transaction of it is aborted first);
* ``add_partitions(transactional_id, producer_id, epoch, partitions)``;
* ``add_offsets(transactional_id, producer_id, epoch, group, offsets)``;
* ``end_transaction(transactional_id, producer_id, epoch, commit, bump=True) -> (producer_id, epoch)``:
  the decision (``PrepareCommit`` / ``PrepareAbort``, epoch bumped; with
  ``bump=False``, for Kafka clients of transaction version 1, the epoch
  stays) is written,
  then the markers, then the completion; the answer is the producer's next
  identity (KIP-890). Once the decision is written the call succeeds even if
  a partition cannot take its marker yet: the coordinator keeps trying, and
  the producer's next transaction waits (``ConcurrentTransactionsError``,
  retriable) until it is done;
* ``verify_partition(transactional_id, producer_id, epoch, topic, partition)``:
  KIP-890's check, asked by a partition before it accepts the first
  transactional batch of a transaction (raises unless it was added);
* ``describe(transactional_id)``: the record, for tools and tests.

**Completion.** A prepared transaction is completed by writing a marker to
each of its partitions (:class:`PartitionMarkers`), then one ZooKeeper
transaction holding the ``Complete*`` record and, for a commit, the group
offsets of the transaction (:meth:`raylog.zk.transactions.TransactionStore.complete`):
the offsets become visible with the commit. The decision is in ZooKeeper
before any marker is written, so a coordinator that dies at any point after
it is replaced (Ray restarts the actor) and the new one finishes it: on
start and then every ``check_interval_s`` it completes every ``Prepare*``
record it finds and aborts every ``Ongoing`` transaction past its timeout.
Writing a marker twice is harmless (the partition's side, below).

**The partition's side** (built in ``raylog/storage`` and the partition
actor; this is the interface the coordinator calls). The leader's
partition actor has a method::

    write_marker(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int) -> int

that appends a control batch (Kafka's control record: key ``{version 0,
type 0 abort / 1 commit}``, value ``{version 0, coordinatorEpoch}``) of
``producer_id`` with ``producer_epoch`` and returns its offset once it is
stored as an ``acks="all"`` write is. ``producer_epoch`` is the bumped epoch,
one more than the transaction's batches carry; the partition accepts a marker
whose epoch is greater than the epoch of the producer's ongoing transaction
(and then refuses that producer's batches of a lower epoch: a late write of
the ended transaction), and answers a repeated marker (same producer, same
epoch, no transaction ongoing) with success and no new batch. Markers whose
``coordinator_epoch`` (the version of the ``Prepare*`` record in ZooKeeper,
growing per transactional id) is lower than the last one the partition took
for the producer id are refused: a zombie coordinator cannot end a later
transaction. Until the partition actor has ``write_marker``, a transaction
with partitions stays prepared (and its producer's next transaction waits);
one with only consumer offsets completes.

Thread-safety: :class:`TransactionCoordinator` serializes the calls on one
transactional id (a lock per id, from a fixed table of locks) and runs calls
on different ids at once; every write is a compare-and-set, so a second
coordinator (a zombie) cannot overwrite a newer record: its write is refused
and it reads and decides again. The actor's timer thread and method threads
share only the coordinator.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Callable, Iterable, Mapping, Protocol

from raylog import auth
from raylog.actors.process_exit import STARTUP_ZOOKEEPER_WAIT_S, exit_process, until_zookeeper
from raylog.actors.cluster_actors import find_named, stop_named
from raylog.config import NAMESPACE, coordinator_name
from raylog.errors import (
    BrokerUnavailableError,
    ConcurrentTransactionsError,
    RaylogError,
    TransactionStateConflictError,
    UnknownPartitionError,
    UnknownTopicError,
)
from raylog.retry import RetryPolicy
from raylog.zk import transaction_states as states
from raylog.zk.producer_ids import DEFAULT_BLOCK_SIZE, ProducerIdBlocks
from raylog.zk.registry import Registry
from raylog.zk.session import connect_kazoo
from raylog.zk.transactions import COMPLETE_COMMIT, ONGOING, PREPARED, TransactionRecord, TransactionStore

log = logging.getLogger(__name__)

#: how often the coordinator completes prepared transactions and aborts timed-out ones
DEFAULT_CHECK_INTERVAL_S = 1.0
#: the timeout of a transaction when the producer names none (Kafka's default)
DEFAULT_TIMEOUT_MS = 60_000
#: how long a partition has to take its marker before the try counts as failed
MARKER_TIMEOUT_S = 30.0
#: how often a call reads and decides again after losing a compare-and-set
CONFLICT_RETRY = RetryPolicy(max_tries=20, delay_s=0.01, max_delay_s=0.5, deadline_s=10.0)
#: the number of locks calls on transactional ids are serialized by
LOCK_STRIPES = 64
#: exit status of a coordinator process ended by its fault file (tests)
EXIT_FAULT = 79


class MarkerWriter(Protocol):
    """Writes the markers of a prepared transaction; returns when every
    partition stored its marker, raises a :class:`RaylogError` otherwise
    (the coordinator tries again later)."""

    def write_markers(self, partitions: Iterable[tuple[str, int]], producer_id: int, producer_epoch: int,
                      commit: bool, *, coordinator_epoch: int) -> None: ...


class PartitionMarkers:
    """:class:`MarkerWriter` against the partition actors: ``write_marker``
    on the leader actor of each partition (found by its endpoint in the
    registry), all partitions at once. A partition whose topic was deleted
    is skipped (its marker has nowhere to go; Kafka does the same).

    Thread-safe (the registry and Ray handles are)."""

    def __init__(self, registry: Registry, timeout_s: float = MARKER_TIMEOUT_S):
        self.registry, self.timeout_s = registry, timeout_s

    def write_markers(self, partitions, producer_id, producer_epoch, commit, *, coordinator_epoch) -> None:
        import ray  # heavy (Ray): imported when used

        calls = []
        for topic, partition in partitions:
            try:
                if partition >= self.registry.topic_config(topic).partitions:
                    raise UnknownPartitionError(f"{topic} has no partition {partition}")
            except (UnknownTopicError, UnknownPartitionError) as err:
                log.warning("transaction marker of producer %d for %s/%d skipped: %s", producer_id, topic,
                            partition, err)
                continue
            endpoint = self.registry.endpoint(topic, partition)
            if endpoint is None:
                raise BrokerUnavailableError(f"{topic}/{partition} has no partition actor serving it now; "
                                             f"its transaction marker is written when it is back")
            try:
                actor = ray.get_actor(endpoint["actor"], namespace=NAMESPACE)
                method = actor.write_marker
            except (ValueError, AttributeError) as err:
                raise BrokerUnavailableError(
                    f"the partition actor of {topic}/{partition} cannot take a transaction marker "
                    f"({type(err).__name__}: {err}); the marker is written once it can") from None
            calls.append(((topic, partition), method.remote(producer_id, producer_epoch, commit, coordinator_epoch)))
        for (topic, partition), ref in calls:
            try:
                ray.get(ref, timeout=self.timeout_s)
            except RaylogError:
                raise
            except Exception as err:  # noqa: BLE001 - the actor died or timed out: try again later
                raise BrokerUnavailableError(f"the transaction marker for {topic}/{partition} was not "
                                             f"written ({type(err).__name__}); it is tried again") from None


class TransactionCoordinator:
    """The coordinator's calls over a :class:`TransactionStore`, a source
    of new producer ids, a :class:`MarkerWriter` and a clock (milliseconds):
    the body of the actor, and what the unit tests drive with in-memory
    stand-ins. Thread-safety: see the module docstring."""

    def __init__(self, store, new_producer_id: Callable[[], int], markers: MarkerWriter, *,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 max_timeout_ms: int = states.MAX_TIMEOUT_MS, after_prepare: Callable[[str], None] | None = None):
        self.store, self.new_producer_id, self.markers = store, new_producer_id, markers
        self.clock_ms, self.max_timeout_ms = clock_ms, max_timeout_ms
        #: called with the transactional id right after a ``Prepare*`` record is written (fault injection)
        self.after_prepare = after_prepare
        self._locks = [threading.RLock() for _ in range(LOCK_STRIPES)]

    def _lock(self, transactional_id: str) -> threading.RLock:
        digest = hashlib.sha256(transactional_id.encode("utf-8", "surrogatepass")).digest()
        return self._locks[int.from_bytes(digest[:4], "big") % LOCK_STRIPES]

    def _decide(self, transactional_id: str, decide) -> tuple[states.Step, TransactionRecord | None, int | None]:
        """Read, decide, write by compare-and-set; read and decide again when
        another writer got there first. Returns the step, the record as it
        stands after it and its version."""

        def once():
            found = self.store.read(transactional_id)
            record, version = found if found is not None else (None, None)
            step = decide(record)
            if step.record is None:
                return step, record, version
            new_version = self.store.write(transactional_id, step.record, version)
            if step.record.state in PREPARED and self.after_prepare is not None:
                self.after_prepare(transactional_id)
            return step, step.record, new_version

        backoff = CONFLICT_RETRY.start()
        while True:
            try:
                return once()
            except TransactionStateConflictError:
                if not backoff.wait():
                    raise

    def _complete(self, transactional_id: str, record: TransactionRecord, version: int) -> int:
        """Markers, then the ``Complete*`` record (with a commit's offsets)."""
        markers = states.markers_of(record)
        if markers.partitions:
            self.markers.write_markers(markers.partitions, markers.producer_id, markers.producer_epoch,
                                       markers.commit, coordinator_epoch=version)
        done = states.complete(record, now_ms=self.clock_ms())
        offsets = record.group_offsets if done.state == COMPLETE_COMMIT else {}
        return self.store.complete(transactional_id, done, version, offsets)

    def _settled(self, transactional_id: str, call):
        """``call()``; when it finds the previous transaction still prepared
        (a marker that could not be written before), try to complete it now
        and call once more."""
        try:
            return call()
        except ConcurrentTransactionsError:
            found = self.store.read(transactional_id)
            if found is None or found[0].state not in PREPARED or not self._try_complete(transactional_id, *found):
                raise
            return call()

    def _try_complete(self, transactional_id: str, record: TransactionRecord, version: int) -> bool:
        try:
            self._complete(transactional_id, record, version)
            return True
        except TransactionStateConflictError:
            return True  # another coordinator moved it on: not ours to finish
        except RaylogError as err:
            log.info("transaction of %r stays %s for now: %s", transactional_id, record.state, err)
            return False

    # -- the calls -----------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> tuple[int, int]:
        def decide():
            return self._decide(transactional_id, lambda r: states.init_producer_id(
                r, transactional_id, timeout_ms=timeout_ms, now_ms=self.clock_ms(),
                new_producer_id=self.new_producer_id, max_timeout_ms=self.max_timeout_ms))

        with self._lock(transactional_id):
            for _ in range(3):  # at most: abort the fenced epoch's transaction, then bump
                step, record, version = self._settled(transactional_id, decide)
                if not step.init_again:
                    return step.reply
                if not self._try_complete(transactional_id, record, version):
                    raise ConcurrentTransactionsError(
                        f"the ongoing transaction of {transactional_id!r} of the fenced producer is being "
                        f"aborted (its markers are not all written yet); retry shortly",
                        transactional_id=transactional_id)
            raise ConcurrentTransactionsError(f"the producer of {transactional_id!r} could not be started for "
                                              f"transactions changing under it; retry",
                                              transactional_id=transactional_id)

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[tuple[str, int]]) -> None:
        partitions = [tuple(tp) for tp in partitions]
        with self._lock(transactional_id):
            self._settled(transactional_id, lambda: self._decide(transactional_id, lambda r: states.add_partitions(
                r, transactional_id, producer_id, producer_epoch, partitions, now_ms=self.clock_ms())))

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group: str,
                    offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        with self._lock(transactional_id):
            self._settled(transactional_id, lambda: self._decide(transactional_id, lambda r: states.add_offsets(
                r, transactional_id, producer_id, producer_epoch, group, offsets, now_ms=self.clock_ms())))

    def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        commit: bool, bump: bool = True) -> tuple[int, int]:
        with self._lock(transactional_id):
            step, record, version = self._decide(transactional_id, lambda r: states.end_transaction(
                r, transactional_id, producer_id, producer_epoch, bool(commit), now_ms=self.clock_ms(),
                new_producer_id=self.new_producer_id, bump=bool(bump)))
            if step.record is not None:
                self._try_complete(transactional_id, record, version)
            return step.reply

    def verify_partition(self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str,
                         partition: int) -> None:
        found = self.store.read(transactional_id)
        states.verify_partition(found[0] if found else None, transactional_id, producer_id, producer_epoch,
                                topic, partition)

    def describe(self, transactional_id: str) -> dict | None:
        found = self.store.read(transactional_id)
        if found is None:
            return None
        record, version = found
        return {"transactional_id": transactional_id, "version": version, "state": record.state,
                "producer_id": record.producer_id, "producer_epoch": record.producer_epoch,
                "partitions": list(record.partitions), "groups": record.group_offsets,
                "timeout_ms": record.timeout_ms, "started_ms": record.started_ms}

    # -- the coordinator's own work --------------------------------------------

    def check(self) -> dict[str, list[str]]:
        """One pass: complete every prepared transaction, abort (and then
        complete) every ongoing one past its timeout. Returns the
        transactional ids ``completed``, ``expired`` and ``pending`` (still
        prepared: a partition did not take its marker)."""
        done: dict[str, list[str]] = {"completed": [], "expired": [], "pending": []}
        for tid, record, _ in list(self.store.records()):
            if record.state not in PREPARED and record.state != ONGOING:
                continue
            with self._lock(tid):
                try:
                    found = self.store.read(tid)
                    if found is None:
                        continue
                    record, version = found
                    if record.state == ONGOING:
                        step, record, version = self._decide(tid, lambda r: states.expire(
                            r, now_ms=self.clock_ms(), new_producer_id=self.new_producer_id)
                            if r is not None else states.Step())
                        if step.record is None:
                            continue
                        log.info("transaction of %r passed its timeout of %d ms: aborting it", tid,
                                 record.timeout_ms)
                        done["expired"].append(tid)
                    if record is not None and record.state in PREPARED:
                        ok = self._try_complete(tid, record, version)
                        done["completed" if ok else "pending"].append(tid)
                except RaylogError as err:
                    log.info("transaction of %r left for the next pass: %s", tid, err)
                    done["pending"].append(tid)
        return done


# ----------------------------------------------------------------------------
# the actor


class TransactionCoordinatorActor:
    """The body of the coordinator's actor (see the module docstring).

    ``fault_file`` (tests): while a file of that name exists, the process
    removes it and exits right after writing the next ``Prepare*`` record,
    as a crash between the decision and its completion would; Ray starts
    the actor again, which completes the transaction."""

    def __init__(self, zookeeper: str, cluster: str, check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
                 block_size: int = DEFAULT_BLOCK_SIZE, max_timeout_ms: int = states.MAX_TIMEOUT_MS,
                 fault_file: str | None = None):
        # the token is derived here, as the partition actors do (raylog.auth)
        self.cluster = cluster
        # ZooKeeper away at start: retried, then the process exits and Ray
        # starts it again (a constructor that raised would end the actor for good)
        self.zk = until_zookeeper(time.monotonic() + STARTUP_ZOOKEEPER_WAIT_S, "the transaction coordinator",
                                  lambda: connect_kazoo(zookeeper, token=auth.cluster_token(cluster), cluster=cluster))
        self.registry = Registry(self.zk, cluster)
        store = TransactionStore(self.zk, cluster)
        blocks = ProducerIdBlocks(self.zk, store.paths, block_size)
        self.fault_file = fault_file
        self.coordinator = TransactionCoordinator(store, blocks.next_id, PartitionMarkers(self.registry),
                                                  max_timeout_ms=max_timeout_ms, after_prepare=self._fault)
        self.check_interval_s = check_interval_s
        self.passes = 0
        self.last: dict = {}
        self._stopped = threading.Event()
        self._pass()  # finish what a previous incarnation left prepared, before any call
        self._thread = threading.Thread(target=self._run, name="raylog-transaction-coordinator", daemon=True)
        self._thread.start()

    def _fault(self, transactional_id: str) -> None:
        if self.fault_file is None:
            return
        try:
            os.unlink(self.fault_file)
        except FileNotFoundError:
            return
        exit_process(EXIT_FAULT, "transaction coordinator of %s: fault file %s: exiting after the decision "
                     "of %r was written", self.cluster, self.fault_file, transactional_id)

    def _pass(self) -> None:
        try:
            self.last = self.coordinator.check()
            self.passes += 1
        except RaylogError as err:
            log.log(logging.DEBUG if err.retriable else logging.WARNING,
                    "transaction coordinator of %s: pass failed (%s); trying again in %g s", self.cluster, err,
                    self.check_interval_s)
        except Exception:  # noqa: BLE001 - unexpected: its traceback, then try again next time
            log.exception("transaction coordinator of %s: pass failed", self.cluster)

    def _run(self) -> None:
        while not self._stopped.wait(self.check_interval_s):
            self._pass()

    def init_producer_id(self, transactional_id: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> tuple[int, int]:
        return self.coordinator.init_producer_id(transactional_id, timeout_ms)

    def add_partitions(self, transactional_id, producer_id, producer_epoch, partitions) -> None:
        self.coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions)

    def add_offsets(self, transactional_id, producer_id, producer_epoch, group, offsets=None) -> None:
        self.coordinator.add_offsets(transactional_id, producer_id, producer_epoch, group, offsets)

    def end_transaction(self, transactional_id, producer_id, producer_epoch, commit, bump=True) -> tuple[int, int]:
        return self.coordinator.end_transaction(transactional_id, producer_id, producer_epoch, commit, bump)

    def verify_partition(self, transactional_id, producer_id, producer_epoch, topic, partition) -> None:
        self.coordinator.verify_partition(transactional_id, producer_id, producer_epoch, topic, partition)

    def describe(self, transactional_id: str) -> dict | None:
        return self.coordinator.describe(transactional_id)

    def status(self) -> dict:
        return {"cluster": self.cluster, "passes": self.passes, "last": self.last, "pid": os.getpid()}

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        self._stopped.set()
        try:
            self.zk.stop()
            self.zk.close()
        except Exception:  # noqa: BLE001 - stopping anyway
            pass


def start_transaction_coordinator(zookeeper: str, cluster: str, *, timeout_s: float = 60.0, wait: bool = True,
                                  **options):
    """Start the cluster's transaction coordinator unless it runs; return
    its handle, with ``wait`` once it answers (it has then finished what a
    previous incarnation left prepared). ``options`` go to
    :class:`TransactionCoordinatorActor`."""
    import ray  # heavy (Ray): imported when used

    actor = (
        ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=8)(TransactionCoordinatorActor)
        .options(name=coordinator_name(cluster), namespace=NAMESPACE, lifetime="detached", get_if_exists=True)
        .remote(zookeeper, cluster, **options)
    )
    if not wait:
        return actor
    ready, _ = ray.wait([actor.ping.remote()], timeout=timeout_s)
    if not ready:
        raise RaylogError(f"the transaction coordinator of cluster {cluster!r} did not start within "
                          f"{timeout_s:g} s", retriable=True)
    return actor


def find_transaction_coordinator(cluster: str):
    """The running transaction coordinator of ``cluster``, or None."""
    return find_named(coordinator_name(cluster))


def stop_transaction_coordinator(cluster: str, timeout_s: float = 10.0) -> bool:
    """Stop the cluster's transaction coordinator (True if one ran)."""
    return stop_named(coordinator_name(cluster), timeout_s)
