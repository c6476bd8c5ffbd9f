"""The leader's side of replication: its followers' log ends, the ISR and
the high watermark, and the two views of its log that its data server
serves.

- Clients (producers, consumers) see :class:`ClientView`: reads and the
  high watermark stop at the **committed** offset, the smallest log end
  among the in-sync replicas (the leader's own flushed end included); a
  flush (what ``acks="all"`` calls) returns once every ISR member has the
  appended bytes, or raises the retriable :class:`NotEnoughReplicasError`
  while the ISR is smaller than ``min_insync_replicas``.
- A follower fetches with a REPLICA_FETCH of its own
  (:mod:`raylog.transfer.protocol`); the data server's handler calls
  :meth:`Leader.record_progress` with what the request says (the follower's
  log end and flushed end: as in Kafka, a fetch at ``o`` says the follower
  has everything below ``o``), which updates the committed offset, wakes
  whoever waits for it, and brings a caught-up follower back into the ISR
  at once; then :meth:`Leader.replica_read` answers the leader's appended
  bytes, flushed or not (the long poll, :meth:`Leader.wait_for_end`, ends as
  soon as an append arrives, so the follower syncs while the leader does;
  the committed offset still needs the leader's own flush) with the
  idempotent producers' sets they hold. The leader is the data server's
  :class:`~raylog.transfer.replica_source.ReplicaSource`.

ISR: a follower whose fetches have not reached the leader's flushed end for
``replica_lag_ms`` leaves the ISR; one that reaches the committed offset
rejoins. :meth:`Leader.maintain` (the actor's timer) writes such changes to
the ``state`` node by compare-and-set. The leader also reads the ``state``
node again every :data:`REFRESH_INTERVAL_S` (and whenever its own write
lost): a reassignment (:mod:`raylog.replication.reassign`) adds replicas
that then fetch from it, and removes others.

Leading ends (:meth:`Leader.check_leading`): while its ZooKeeper connection
is down, and after a lost session until the ``state`` node is read again,
the leader refuses every write with the retriable :class:`NotOwnerError`
(the client looks the endpoint up again), so that a leader cut off from
ZooKeeper but still reachable by clients acknowledges nothing after its
session may have expired; once the ``state`` node names another leader it
is **deposed**: it refuses everything and calls ``on_deposed`` (the
partition actor then ends its process; Ray starts it again as a follower,
which truncates to the new leader's epoch boundary).

Thread-safety: :class:`Leader` guards its fields with one condition (and
its ISR review with a lock of its own); :class:`ClientView` keeps no state
of its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, SessionExpiredError

from raylog.errors import NotEnoughReplicasError, NotOwnerError, OffsetOutOfRangeError
from raylog.replication.state import compare_and_set, read_state
from raylog.storage.log import CommittedRead
from raylog.storage.log_reads import FileSlice
from raylog.storage.record_batch import format_at
from raylog.transfer.protocol import REPLICA_FETCH_SETS_MAX_BYTES
from raylog.transfer.replica_source import ReplicaRead

#: bytes that tell a message's format from a record batch's (raylog.storage.record_batch.format_at)
_FORMAT_BYTES = 17

log = logging.getLogger(__name__)

#: how often the leader reads its ``state`` node again (replicas added or removed)
REFRESH_INTERVAL_S = 1.0
#: how long a follower that another writer took out of the ISR stays out when it does not restart
PARKED_HOLD_S = 600.0


class Leader:
    """The leader of one partition (see the module docstring)."""

    def __init__(self, zk, paths, topic: str, partition: int, node: str, partition_log, state, version: int,
                 on_deposed=None):
        self.zk, self.paths, self.topic, self.partition, self.node = zk, paths, topic, partition, node
        self.log = partition_log
        self.config = partition_log.config
        self._state, self._version = state, version
        self._cond = threading.Condition()
        #: one ISR review at a time (the timer's, or a replica fetch's that brings a follower back)
        self._reviewing = threading.Lock()
        now = time.monotonic()
        #: follower -> (flushed end it reported last, when it was last caught up,
        #: the leader's flushed end at its previous fetch); caught up (Kafka's
        #: rule) is a fetch from at or past the flushed end of the fetch before
        self._progress = {n: (None, now, 0) for n in state.replicas if n != node}
        self._next_refresh = now + REFRESH_INTERVAL_S
        # Starting (restarted on its node, or promoted) the leader does not
        # know how far the other ISR members reach: what it flushed becomes
        # visible as their first fetches say they hold it, not before (a
        # leader lost again right away would otherwise have shown, and
        # acknowledged acks="all" retries of, bytes no follower has).
        self._committed = partition_log.log_start_offset
        #: called (on the timer thread) once the ``state`` node names another leader
        self._on_deposed = on_deposed
        self.deposed = False
        #: False from a lost ZooKeeper session until the ``state`` node is read again
        self._session_checked = True
        #: a handoff (raylog.replication.handoff): the replica taking the lead, None otherwise; while
        #: set, new appends are refused and the count of appends in progress drains to 0
        self._handing_to: str | None = None
        self._appending = 0
        #: followers taken out of the ISR for a drain: node -> (its replica session then, until when)
        self._parked: dict[str, tuple[int | None, float]] = {}
        if zk is not None:  # (None: the pure logic alone, in tests)
            zk.add_listener(self._on_session_state)
        with self._cond:
            self._advance()

    # -- is this replica still the leader? ---------------------------------------

    def _on_session_state(self, state) -> None:
        """kazoo's listener (its event thread: no ZooKeeper calls here)."""
        if state == "LOST":
            self._session_checked = False  # a follower may have taken over meanwhile
            self._next_refresh = 0.0

    def check_leading(self) -> None:
        """Raise the retriable :class:`NotOwnerError` (clients look the
        endpoint up again) unless this replica may go on leading: it was
        deposed, or its ZooKeeper connection is down (its session may
        expire and a follower take over while it is away: a leader cut off
        from ZooKeeper but reachable by clients, the "zombie", acknowledges
        nothing from then on), or its session was lost and the ``state``
        node not read again since."""
        connected = self.zk is None or self.zk.connected
        if self.deposed or not connected or not self._session_checked:
            why = ("another replica leads now" if self.deposed else
                   "its ZooKeeper connection is down" if not connected else
                   "its ZooKeeper session was lost and its leadership is not confirmed yet")
            raise NotOwnerError(
                f"replica {self.node} of {self.topic}-{self.partition} does not accept writes: {why}; "
                f"look the endpoint up again and retry", topic=self.topic, partition=self.partition,
            )

    def _check_state(self, state) -> None:
        """The ``state`` node as read now: deposed when it names another leader."""
        if state.leader != self.node and state.leader == self._handing_to:
            self.deposed = True  # our own handoff: the role turns this replica into a follower
            return
        if state.leader != self.node:
            if not self.deposed:
                self.deposed = True
                log.warning("%s-%d: replica %s is no longer the leader (%s leads in epoch %d)", self.topic,
                            self.partition, self.node, state.leader, state.leader_epoch)
                with self._cond:
                    self._cond.notify_all()
                if self._on_deposed is not None:
                    self._on_deposed()
            return
        self._session_checked = True

    def stop(self) -> None:
        if self.zk is not None:
            self.zk.remove_listener(self._on_session_state)

    # -- handoff (raylog.replication.handoff) ---------------------------------------

    def begin_append(self) -> None:
        """Before a client's append: raise :class:`NotOwnerError` unless
        this replica leads and is not handing its lead off; else count the
        append as in progress until :meth:`end_append`."""
        self.check_leading()
        with self._cond:
            self.check_accepting()
            self._appending += 1

    def end_append(self) -> None:
        with self._cond:
            self._appending -= 1
            self._cond.notify_all()

    def check_accepting(self) -> None:
        """Raise :class:`NotOwnerError` while a handoff is under way."""
        target = self._handing_to
        if target is not None:
            raise NotOwnerError(
                f"replica {self.node} of {self.topic}-{self.partition} is handing its lead to {target}; look the "
                f"endpoint up again and retry", topic=self.topic, partition=self.partition,
            )

    def stop_accepting(self, target: str, deadline: float) -> bool:
        """Refuse new appends (a handoff to ``target``) and wait until those
        in progress ended; False when they did not by ``deadline``."""
        with self._cond:
            self._handing_to = target
            return self._cond.wait_for(lambda: self._appending == 0, max(0.0, deadline - time.monotonic()))

    def resume_accepting(self) -> None:
        """A handoff that did not complete: accept appends again."""
        with self._cond:
            self._handing_to = None
            self._cond.notify_all()

    def wait_reached(self, node: str, offset: int, deadline: float) -> bool:
        """Whether the follower on ``node`` fetched from ``offset`` or past
        it (so it holds everything below) by ``deadline``."""

        def reached() -> bool:
            end = self._progress.get(node, (None,))[0]
            return end is not None and end >= offset

        with self._cond:
            return self._cond.wait_for(reached, max(0.0, deadline - time.monotonic()))

    def park(self, node: str, session: int | None, hold_s: float) -> None:
        """Keep ``node`` out of the ISR (a drain took it out) until its
        replica registers under another ZooKeeper session than ``session``
        (it was restarted), or ``hold_s`` passed."""
        with self._cond:
            self._parked[node] = (session, time.monotonic() + hold_s)

    def shed(self, node: str, hold_s: float) -> bool:
        """Take the follower on ``node`` out of the ISR now and keep it out
        (:meth:`park`) until it restarts: a drain, before its node stops, so
        that ``acks="all"`` never waits for it. False (nothing changed) when
        the ISR would fall below ``min_insync_replicas`` or this replica no
        longer leads."""
        from raylog.replication.state import replica_path

        stat = self.zk.exists(replica_path(self.paths, self.topic, self.partition, node))
        self.park(node, None if stat is None else stat.ephemeralOwner, hold_s)
        for _ in range(20):
            state, version = read_state(self.zk, self.paths, self.topic, self.partition)
            self._check_state(state)
            if self.deposed:
                break
            if node not in state.isr:
                self._adopt(state, version)
                return True
            if len(state.isr) - 1 < self.config.min_insync_replicas:
                break
            proposed = state.with_isr(set(state.isr) - {node})
            written = compare_and_set(self.zk, self.paths, self.topic, self.partition, proposed, version)
            if written is not None:
                log.info("%s-%d: follower %s left the ISR for a drain; ISR is now %s", self.topic, self.partition,
                         node, list(proposed.isr))
                self._adopt(proposed, written)
                return True
        with self._cond:
            self._parked.pop(node, None)
        return False

    def _unpark(self, now: float) -> None:
        """Let parked followers that restarted (or were held long enough) rejoin."""
        from raylog.replication.state import replica_path

        for node, (session, until) in list(self._parked.items()):
            stat = self.zk.exists(replica_path(self.paths, self.topic, self.partition, node)) if self.zk else None
            if now >= until or (stat is not None and stat.ephemeralOwner != session):
                del self._parked[node]

    @property
    def state(self):
        return self._state

    @property
    def committed(self) -> int:
        return self._committed

    def follower_ends(self) -> dict[str, int | None]:
        with self._cond:
            return {n: progress[0] for n, progress in self._progress.items()}

    def _advance(self) -> None:
        """Recompute the committed offset (condition held); wake waiters."""
        ends = [self.log.high_watermark]
        for n in self._state.isr:
            if n != self.node:
                end = self._progress.get(n, (None,))[0]
                ends.append(self.log.log_start_offset if end is None else end)
        committed = min(ends)
        if committed > self._committed:
            self._committed = committed
            self._cond.notify_all()

    # -- the followers' replica fetches (raylog.transfer.replica_source.ReplicaSource) ------

    def replicas_hold(self) -> int:
        """The lowest offset up to which every replica of the partition,
        this one included, is known to hold the log (synced): 0 while a
        follower has not fetched since this leader started. The log
        cleaner removes tombstones only below it."""
        with self._cond:
            flushed = [entry[0] for entry in self._progress.values()]
        if any(end is None for end in flushed):
            return 0
        return min([self.log.high_watermark, *flushed])

    def record_progress(self, replica: str, leader_epoch: int, log_end: int, flushed: int) -> None:
        """A follower's REPLICA_FETCH says that ``replica`` holds the log up
        to ``log_end``, synced up to ``flushed``: the committed offset moves
        (``acks="all"`` counts synced bytes), waiters wake, and a follower
        outside the ISR that caught up rejoins it now (a compare-and-set on
        the ``state`` node, here on the fetch's thread) rather than at the
        next review. Raises :class:`NotOwnerError` for a replica that is not
        one of this partition's, another leader epoch, or a deposed leader."""
        if self.deposed:
            raise NotOwnerError(f"replica {self.node} of {self.topic}-{self.partition} no longer leads; read the "
                                f"partition's state again", topic=self.topic, partition=self.partition)
        epoch = self._state.leader_epoch
        if leader_epoch != epoch:
            raise NotOwnerError(
                f"replica {replica} fetches {self.topic}-{self.partition} in leader epoch {leader_epoch}, this "
                f"leader's is {epoch}; read the partition's state again (truncating to the epoch's boundary) and "
                f"fetch again", topic=self.topic, partition=self.partition)
        rejoins = False
        with self._cond:
            previous = self._progress.get(replica)
            if previous is None:
                raise NotOwnerError(
                    f"{replica!r} is not a follower of {self.topic}-{self.partition} (replicas "
                    f"{', '.join(self._state.replicas)}); a replica that was reassigned away stops fetching",
                    topic=self.topic, partition=self.partition)
            _, caught_up_at, before = previous
            leader_flushed = self.log.high_watermark
            if log_end >= min(before, leader_flushed):
                caught_up_at = time.monotonic()
            self._progress[replica] = (flushed, caught_up_at, leader_flushed)
            self._advance()
            rejoins = (replica not in self._state.isr and replica not in self._parked
                       and flushed >= self._committed)
        if rejoins and self._reviewing.acquire(blocking=False):
            try:
                self._review()
            finally:
                self._reviewing.release()

    def replica_read(self, replica: str, offset: int, max_bytes: int) -> ReplicaRead:
        """The log from ``offset`` up to its end, flushed or not (the
        follower's sync overlaps the leader's; the committed offset waits
        for both), and the producers' sets those bytes hold (read after
        them, so that they cover every set the bytes hold). Record batches
        (format 2) carry their producers' fields themselves, which is what a
        replica remembers them from: their answer has no sets (nor the
        writer's lock taken to read them)."""
        chunk = self.log.read_unflushed(offset, max_bytes)
        sets = b""
        if chunk.length and not _record_batches(chunk):
            sets = self.log.producer_records(offset, replica_sets_bytes(max_bytes), learnt=True)
        return ReplicaRead(chunk, sets, self._committed, self.log.log_start_offset, self._state.leader_epoch)

    def wait_for_end(self, offset: int, timeout_s: float) -> bool:
        """A follower's long poll: until an append passes ``offset``."""
        return self.log.wait_for_end(offset, timeout_s)

    def wait_for_commit(self, offset: int, timeout_s: float) -> bool:
        """A consumer's long poll: until the committed offset passes
        ``offset`` (or ``timeout_s``, or the log closes); whether it did."""
        with self._cond:
            self._cond.wait_for(lambda: self._committed > offset or self.log.closed, max(0.0, timeout_s))
            return self._committed > offset

    def on_flush(self) -> None:
        """The leader's own flush advanced its log's high watermark: the
        committed offset may move now (not only at the next fetch)."""
        with self._cond:
            self._advance()

    def maintain(self) -> None:
        """Shrink or expand the ISR by ``replica_lag_ms`` (timer thread).
        While ZooKeeper is away nothing is read or written (the next call
        tries again); the leader refuses writes meanwhile (:meth:`check_leading`)."""
        if self.deposed or (self.zk is not None and not self.zk.connected):
            return  # nothing to write; and a call would wait for ZooKeeper on the timer thread
        with self._reviewing:
            self._review()

    def _review(self) -> None:
        """:meth:`maintain` with the review lock held."""
        if self.deposed or (self.zk is not None and not self.zk.connected):
            return
        try:
            self._maintain()
        except (ConnectionLoss, SessionExpiredError, ConnectionClosedError) as err:
            log.info("%s-%d: ZooKeeper went away while the ISR was reviewed (%s); again later", self.topic,
                     self.partition, type(err).__name__)

    def _maintain(self) -> None:
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + REFRESH_INTERVAL_S
            found = read_state(self.zk, self.paths, self.topic, self.partition)
            if found is not None:
                self._check_state(found[0])
                if self.deposed:
                    return
                if found[1] != self._version:
                    self._adopt_written(*found)
            if self._parked:
                self._unpark(now)
        lag_s = self.config.replica_lag_ms / 1000.0
        with self._cond:
            self._advance()
            isr = set(self._state.isr)
            for n, (end, caught_up_at, _) in self._progress.items():
                if n in isr and now - caught_up_at > lag_s:
                    isr.discard(n)
                elif (n not in isr and n not in self._parked and end is not None and end >= self._committed
                      and now - caught_up_at <= lag_s):
                    isr.add(n)
            if isr == set(self._state.isr):
                return
            proposed = self._state.with_isr(isr)
        version = compare_and_set(self.zk, self.paths, self.topic, self.partition, proposed, self._version)
        if version is None:  # changed by someone else: take what is there
            proposed, version = read_state(self.zk, self.paths, self.topic, self.partition)
            self._check_state(proposed)
            if self.deposed:
                return
            self._adopt_written(proposed, version)
        else:
            self._adopt(proposed, version)
        log.info("%s-%d ISR is now %s", self.topic, self.partition, list(proposed.isr))

    def _adopt_written(self, state, version: int) -> None:
        """Take ``state`` as another writer left it. A follower it took out
        of the ISR (one stopping in order, :func:`~raylog.replication.state.leave_isr`)
        stays out until it restarts, rather than rejoining at once because
        it was caught up a moment ago."""
        from raylog.replication.state import replica_path

        left = [n for n in self._state.isr if n not in state.isr and n in state.replicas and n != self.node]
        for n in left:
            stat = self.zk.exists(replica_path(self.paths, self.topic, self.partition, n)) if self.zk else None
            self.park(n, None if stat is None else stat.ephemeralOwner, PARKED_HOLD_S)
        self._adopt(state, version)

    def _adopt(self, state, version: int) -> None:
        """Take ``state`` (read from ZooKeeper): followers a reassignment
        added are tracked from now on, removed ones forgotten."""
        now = time.monotonic()
        with self._cond:
            self._state, self._version = state, version
            for n in state.replicas:
                if n != self.node and n not in self._progress:
                    self._progress[n] = (None, now, 0)
            for n in [n for n in self._progress if n not in state.replicas]:
                del self._progress[n]
            self._advance()
            self._cond.notify_all()

    def check_isr(self) -> None:
        isr = self._state.isr
        if len(isr) < self.config.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{self.topic}-{self.partition} has {len(isr)} in-sync replicas ({', '.join(isr)}), fewer than "
                f"min_insync_replicas={self.config.min_insync_replicas}; retry once followers catch up",
                topic=self.topic, partition=self.partition,
            )

    def wait_committed(self, target: int, timeout_s: float) -> None:
        """Return once the committed offset reaches ``target`` with at least
        ``min_insync_replicas`` in the ISR; raise
        :class:`NotEnoughReplicasError` when the ISR falls below
        ``min_insync_replicas`` or ``timeout_s`` passes first. The ISR is
        checked when the target is reached too: a shrink of the ISR moves the
        committed offset up to what fewer replicas hold, and bytes the leader
        alone holds are not acknowledged (Kafka's
        NOT_ENOUGH_REPLICAS_AFTER_APPEND; the producer sends them again)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._advance()
            while self._committed < target:
                self.check_leading()
                self.check_isr()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NotEnoughReplicasError(
                        f"{self.topic}-{self.partition}: the in-sync replicas did not confirm offset {target} "
                        f"within {timeout_s:g} s; retry", topic=self.topic, partition=self.partition,
                    )
                self._cond.wait(min(left, 0.1))
                self._advance()
            self.check_isr()


def replica_sets_bytes(max_bytes: int) -> int:
    """The most bytes of producers' sets a replica fetch of ``max_bytes``
    is answered with (:data:`~raylog.transfer.protocol.REPLICA_FETCH_SETS_MAX_BYTES`)."""
    return min(max_bytes, REPLICA_FETCH_SETS_MAX_BYTES)


def _record_batches(chunk) -> bool:
    """Whether a slice of the log starts with a record batch (format 2; a
    segment holds one format, and a read stays within one segment)."""
    if isinstance(chunk, FileSlice):
        head = os.pread(chunk.file.fileno(), _FORMAT_BYTES, chunk.position)
    else:
        head = chunk.tobytes()[:_FORMAT_BYTES]
    return format_at(head) == 2


class ClientView:
    """The leader's log as producers and consumers see it (see the module
    docstring): what the data server serves under the partition's topic
    (a :class:`~raylog.storage.base.Log`)."""

    def __init__(self, leader: Leader):
        self._leader, self._log = leader, leader.log

    @property
    def config(self):
        return self._log.config

    @property
    def log_start_offset(self) -> int:
        return self._log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def closed(self) -> bool:
        return self._log.closed

    def close(self) -> None:
        self._log.close()

    @property
    def high_watermark(self) -> int:
        return self._leader.committed

    def before_acks_all(self) -> None:
        """The data server's check before an ``acks="all"`` append."""
        self._leader.check_leading()
        self._leader.check_accepting()
        self._leader.check_isr()

    def append(self, data, *args, **kwargs):
        """The log's :meth:`~raylog.storage.log.PartitionLog.append`, with
        the batches of format 2 stamped with this leader's epoch (their
        ``partitionLeaderEpoch``, *set at append*: docs/design.md §2)."""
        kwargs.setdefault("leader_epoch", self._leader.state.leader_epoch)
        self._leader.begin_append()
        try:
            return self._log.append(data, *args, **kwargs)
        finally:
            self._leader.end_append()

    def append_sequenced(self, *args, **kwargs):
        self._leader.begin_append()
        try:
            return self._log.append_sequenced(*args, **kwargs)
        finally:
            self._leader.end_append()

    def flush(self) -> bool:
        self._leader.check_isr()
        target = self._log.log_end_offset
        flushed = self._log.flush()
        self._leader.wait_committed(target, self._log.config.replica_lag_ms / 1000.0)
        self._leader.check_leading()  # no acks="all" answered by a replica that may have lost the lead
        return flushed

    def read(self, offset: int, max_bytes: int):
        committed = self._leader.committed
        if committed < offset <= self._log.high_watermark:
            # a position read before this leader started: nothing yet, no error
            return self._log.read(offset, max_bytes)._replace(length=0)
        if offset > committed:
            start = self._log.log_start_offset
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log [{start}, {committed}]; seek to the earliest "
                f"({start}) or latest ({committed}) offset", offset=offset, earliest=start, latest=committed,
            )
        chunk = self._log.read(offset, max_bytes)
        return chunk._replace(length=max(0, min(chunk.length, committed - offset)))

    def read_committed(self, offset: int, max_bytes: int):
        """:meth:`read` for a ``read_committed`` reader (the log's
        :meth:`~raylog.storage.log.PartitionLog.read_committed` counted from
        the committed offset: a transaction whose marker the in-sync
        replicas do not all hold yet is still open to readers)."""
        committed = self._leader.committed
        if committed < offset <= self._log.high_watermark:
            # a position read before this leader started: nothing yet, no error
            empty = self._log.read(offset, max_bytes)._replace(length=0)
            return CommittedRead(empty, [], committed)
        if offset > committed:
            return self.read(offset, max_bytes)  # raises OffsetOutOfRangeError
        return self._log.read_committed(offset, max_bytes, high_watermark=committed)

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        return self._leader.wait_for_commit(offset, timeout_s)

    def offset_for_time(self, timestamp_ms: int) -> int:
        return min(self._log.offset_for_time(timestamp_ms), self._leader.committed)
