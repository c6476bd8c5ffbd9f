"""The transaction coordinator's logic (raylog.actors.transaction_coordinator.
TransactionCoordinator) against a model, with hypothesis: random calls of
three producers sharing a transactional id, time passing, partitions that
cannot take markers for a while, and the coordinator crashing at any point
of any call (a new one then takes over the same store and finishes).

The store and the marker writer are in-memory stand-ins (unit level: the
ZooKeeper store and the partition actors have tests of their own); the
store keeps ZooKeeper's versions and compare-and-set, and both record
everything written, so the properties are checked on the history:

* no transaction is ever both committed and aborted (its markers, its
  completion and its decision agree);
* a fenced epoch's calls are always refused, and change nothing;
* every prepared transaction reaches its completion after any crash point
  once the partitions take markers again, and a commit's offsets are
  written with its completion, an abort's never;
* KIP-890: every marker's epoch is above the epoch the transaction's
  producer wrote with, and no transaction passes its timeout unaborted.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raylog.actors.transaction_coordinator import TransactionCoordinator
from raylog.errors import (
    BrokerUnavailableError,
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionError,
    TransactionStateConflictError,
)
from raylog.zk.transactions import COMPLETED, ONGOING, PREPARE_COMMIT, PREPARED

TID = "tx"
PARTITIONS = [("t", 0), ("t", 1), ("u", 0)]
TIMEOUT_MS = 1000


class Crash(BaseException):
    """The coordinator's process dies here (not an error any code handles)."""


class Faults:
    def __init__(self):
        self.countdown: int | None = None

    def point(self) -> None:
        if self.countdown is None:
            return
        if self.countdown == 0:
            self.countdown = None
            raise Crash()
        self.countdown -= 1


class MemoryStore:
    """ZooKeeper's versions and compare-and-set, in memory; every write is
    kept in ``history``."""

    def __init__(self, faults: Faults):
        self.faults = faults
        self.data: dict = {}
        self.offsets: dict = {}
        self.history: list = []  # (kind, record, offsets)

    def read(self, tid):
        return self.data.get(tid)

    def records(self):
        for tid in sorted(self.data):
            yield tid, *self.data[tid]

    def _cas(self, tid, version):
        current = self.data.get(tid)
        if (current is None) != (version is None) or (current is not None and current[1] != version):
            raise TransactionStateConflictError("stale")
        return 0 if current is None else current[1] + 1

    def write(self, tid, record, version):
        self.faults.point()
        new = self._cas(tid, version)
        self.data[tid] = (record, new)
        self.history.append(("write", record, {}))
        self.faults.point()
        return new

    def complete(self, tid, record, version, offsets):
        self.faults.point()
        new = self._cas(tid, version)
        self.data[tid] = (record, new)
        for group, pending in offsets.items():
            for tp, offset in pending.items():
                self.offsets[(group, *tp)] = offset
        self.history.append(("complete", record, {g: dict(o) for g, o in offsets.items()}))
        self.faults.point()
        return new


class Partitions:
    """The partitions' side as the coordinator's interface describes it:
    markers written one by one (a crash may fall between two)."""

    def __init__(self, faults: Faults):
        self.faults = faults
        self.down = False
        self.markers: list = []  # (topic, partition, producer_id, epoch, commit)
        self.events: list = []  # ("data" | "marker", (topic, partition), producer_id, epoch), in order

    def write_markers(self, partitions, producer_id, producer_epoch, commit, *, coordinator_epoch):
        if self.down:
            raise BrokerUnavailableError("partitions down")
        for topic, partition in partitions:
            self.faults.point()
            self.markers.append((topic, partition, producer_id, producer_epoch, commit))
            self.events.append(("marker", (topic, partition), producer_id, producer_epoch))


#: producer 0 acts most; 1 and 2 now and then start (fencing the others)
_producer = st.sampled_from([0, 0, 0, 0, 1, 2])
_add = st.tuples(st.just("add"), _producer, st.integers(0, 2))
_offsets = st.tuples(st.just("offsets"), _producer, st.integers(0, 2))
_end = st.tuples(st.just("end"), _producer, st.booleans())
# weighted (a strategy listed twice is drawn twice as often): transactions
# that begin and end, with now and then a new producer, time, a crash
ops = st.lists(st.one_of(
    _add, _add, _add, _offsets, _offsets, _end, _end, _end,
    st.tuples(st.just("init"), _producer),
    st.tuples(st.just("verify"), _producer, st.integers(0, 2)),
    st.tuples(st.just("tick"), st.integers(0, 600)),
    st.tuples(st.just("check")),
    st.tuples(st.just("crash"), st.integers(0, 6)),
    st.tuples(st.just("down"), st.booleans()),
), min_size=10, max_size=60).map(lambda program: [("init", 0)] + program)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_the_coordinator_keeps_its_promises_through_crashes(program):
    faults = Faults()
    store, partitions = MemoryStore(faults), Partitions(faults)
    clock = [0]
    ids = itertools.count(1000)
    offset_values = itertools.count(1)

    def coordinator():
        return TransactionCoordinator(store, lambda: next(ids), partitions, clock_ms=lambda: clock[0])

    coord = coordinator()
    held: list = [None, None, None]  # each producer's identity
    handed: list = []  # every identity handed out, in order
    fenced: set = set()
    retired: set = set()  # identities whose transaction ended (only an end retry may still use them)
    refused_fenced = 0

    crashed = object()

    def call(fn, *args):
        nonlocal coord
        try:
            return fn(*args)
        except Crash:
            event("the coordinator crashed")
            coord = coordinator()  # replaced; it finishes what it can on start
            try:
                coord.check()
            except Crash:
                coord = coordinator()
            return crashed

    for op in program:
        kind = op[0]
        if kind == "tick":
            clock[0] += op[1]
            continue
        if kind == "crash":
            faults.countdown = op[1]
            continue
        if kind == "down":
            partitions.down = op[1]
            continue
        if kind == "check":
            call(lambda: coord.check())
            continue
        if kind == "init":
            c = op[1]
            try:
                reply = call(lambda: coord.init_producer_id(TID, TIMEOUT_MS))
            except ConcurrentTransactionsError:
                continue
            if reply is not crashed:
                fenced.update(handed)
                handed.append(reply)
                held[c] = reply
            continue
        c = op[1]
        identity = held[c]
        if identity is None:
            continue
        before = len(store.history)
        try:
            if kind == "add":
                if call(lambda: coord.add_partitions(TID, *identity, [PARTITIONS[op[2]]])) is not crashed:
                    # the producer now writes its batches there, with its epoch
                    partitions.events.append(("data", PARTITIONS[op[2]], *identity))
            elif kind == "offsets":
                call(lambda: coord.add_offsets(TID, *identity, "g", {PARTITIONS[op[2]]: next(offset_values)}))
            elif kind == "verify":
                call(lambda: coord.verify_partition(TID, *identity, *PARTITIONS[op[2]]))
            elif kind == "end":
                reply = call(lambda: coord.end_transaction(TID, *identity, op[2]))
                if reply is not crashed:
                    retired.add(identity)
                    handed.append(reply)
                    held[c] = reply
        except (ProducerFencedError, InvalidProducerEpochError):
            refused_fenced += 1
            event("a fenced or ended epoch's call refused")
            assert len(store.history) == before, "a refused epoch's call changed the record"
            continue
        except (ConcurrentTransactionsError, InvalidTxnStateError):
            continue
        except TransactionError as err:
            raise AssertionError(f"unexpected refusal of {op}: {err!r}") from err
        else:
            # a call that went through was not of a fenced epoch
            assert identity not in fenced, f"{op} of fenced {identity} was accepted"
            if kind in ("add", "offsets", "verify"):
                assert identity not in retired, f"{op} of the ended epoch {identity} was accepted"

    # the end: partitions back, no crash armed; a replacement finishes everything
    faults.countdown = None
    partitions.down = False
    coord = coordinator()
    coord.check()
    clock[0] += 10 * TIMEOUT_MS
    coord.check()

    record, _ = store.read(TID) or (None, None)
    assert record is None or record.state not in PREPARED and record.state != ONGOING

    decided = {}  # (producer id, marker epoch) -> commit?
    for kind, rec, offsets in store.history:
        if kind == "write" and rec.state in PREPARED:
            key = (rec.producer_id, rec.producer_epoch)
            assert decided.setdefault(key, rec.state == PREPARE_COMMIT) == (rec.state == PREPARE_COMMIT), \
                f"transaction {key} decided both ways"
    completed = {}
    prepared_of = {}
    last_prepared = None
    for kind, rec, offsets in store.history:
        if kind == "write" and rec.state in PREPARED:
            last_prepared = rec
        if kind == "complete":
            assert last_prepared is not None and rec.state in COMPLETED
            key = (last_prepared.producer_id, last_prepared.producer_epoch)
            commit = rec.state.endswith("Commit")
            assert decided[key] == commit, f"transaction {key} completed against its decision"
            assert completed.setdefault(key, commit) == commit
            # the offsets of a commit are written with it; an abort writes none
            assert offsets == (last_prepared.group_offsets if commit else {})
            prepared_of[key] = last_prepared
    assert set(completed) == set(decided), "a decided transaction never completed"
    if any(decided.values()):
        event("a transaction committed")
    if any(rec.timed_out for kind, rec, _ in store.history if kind == "write"):
        event("a transaction timed out")

    for topic, partition, pid, epoch, commit in partitions.markers:
        key = (pid, epoch)
        assert decided.get(key) == commit, f"marker {commit} for {key} against the decision"
        assert (topic, partition) in prepared_of[key].partitions
    # KIP-890, as a partition sees it: a marker's epoch is above every epoch
    # the producer wrote with since the last marker (so the partition can
    # refuse a late write of the ended transaction), and an accepted write
    # never carries an epoch below the last marker's (it would be fenced)
    since: dict = {}
    last_marker: dict = {}
    for kind, tp, pid, epoch in partitions.events:
        if kind == "data":
            assert epoch >= last_marker.get((tp, pid), -1), f"write of {pid}/{epoch} on {tp} after a newer marker"
            since.setdefault((tp, pid), []).append(epoch)
        else:
            assert all(e < epoch for e in since.pop((tp, pid), [])), f"marker {pid}/{epoch} on {tp} not above its data"
            last_marker[(tp, pid)] = max(epoch, last_marker.get((tp, pid), -1))
    # every partition of every completed transaction got its marker
    for key, rec in prepared_of.items():
        got = {(t, p) for t, p, pid, e, _ in partitions.markers if (pid, e) == key}
        assert got == set(rec.partitions)
