"""The follower's side of replication: fetch the leader's bytes over the
data channel and append them at the same byte offsets.

One thread per follower replica actor. It finds the leader's endpoint in the
registry and sends REPLICA_FETCH requests (:mod:`raylog.transfer.protocol`)
with its replica id, the leader epoch of its data, its log end and its
flushed end: that is how the leader learns how far it reaches
(:meth:`~raylog.replication.leader.Leader.record_progress`). The answer (a
long poll; the leader sends with ``os.sendfile``) holds the leader's bytes
from the log end, flushed or not, and the idempotent producers' sets they
hold, with where the leader learnt each producer: the follower keeps the
whole messages, appends them with :meth:`PartitionLog.append_replica` at the
offset they have on the leader together with the sets, flushes, and at once
asks again, so that its new flushed end reaches the leader right after its
sync (the next request says it). The sets are appended with the bytes so
that a follower that takes over deduplicates a retry as its leader would.
A set larger than one fetch is appended in parts and remembered with the
fetch that completes it (:func:`replicable`), so it loses no sequence;
its record is journaled with the first part (:func:`spanning`), and a
follower that takes over while it holds only a part cuts that part back
first (:meth:`~raylog.storage.log.PartitionLog.cut_partial_replica_set`),
as a reopen does, so that the producer's retry stores the set once.

Before it follows, a follower whose data is of an older leader epoch than
the ``state`` node's truncates to the boundary where the next epoch began
(:meth:`PartitionState.boundary_after`); the epoch of its data is kept in
the file ``leader-epoch`` of its log directory. When the leader's replica
is gone (its ephemeral ``replicas/<node>`` expired with its session, or
was closed with it), an in-sync follower takes over
(:func:`~raylog.replication.state.take_over`) and hands itself to
``on_promoted``: at once when that leader had been seen serving (its
endpoint registered under the current leader epoch), else once no leader
has served for ``replica_lag_ms`` or
:data:`~raylog.config.LEADER_START_GRACE_MS`, the longer (a leader still
starting is not replaced); with the topic's ``unclean_leader_election`` a follower outside
the ISR may, once no ISR member runs. A leader whose process died leaves
its nodes until its session expires; when the follower's connection to it
fails and a new connect to its port is refused, the follower removes them
(:mod:`raylog.replication.liveness`) and takes over without waiting for
the session timeout.

On a compacted topic every replica runs its own log cleaner, up to the
committed offset it knows (:meth:`ReplicaRole.committed_offset
<raylog.replication.replica.ReplicaRole.committed_offset>`). A follower that
fetches from the leader's cleaned segments (a new replica, or one that was
away) gets batches at offsets that are not their byte positions: it stores
each at its own offset, in the cleaned form where needed (its segment then
carries an offset index, see "Replica writes over cleaned ranges" in
:mod:`raylog.storage.log`), so that it holds the leader's kept records at
the same offsets; where its log ends inside one of the leader's batches
(its copy was cleaned more than the new leader's) it cuts back to that
batch's start and takes it whole. Truncation is by offset, at a batch
boundary, on either form.

Each reply carries the leader's committed offset (its high watermark): the
follower keeps it (:class:`~raylog.replication.follower_reads.ServedWatermark`)
and serves readers up to it (:mod:`raylog.replication.follower_reads`).

Each reply carries the leader's log start offset too: when it is past the
follower's own (records deleted at the leader, ``client.delete_records``),
the follower moves its start there, as far as its log reaches
(:meth:`~raylog.storage.log.PartitionLog.advance_log_start`: kept on disk,
segments wholly below it deleted), so that it serves nothing below it and,
if it takes over, leads with it. The leader serves a follower's fetches
from its first segment's base whatever its start: replicas hold the same
bytes at the same offsets.

A follower whose log end lies before the leader's log start (retention on
the leader deleted what it would fetch next: it was away long, or it is a
new replica) starts its log over, empty, at the leader's log start
(:func:`start_over_if_behind`).

Errors (the leader moving or restarting, ZooKeeper away) close the
connection and retry under a :class:`RetryPolicy` until the follower stops.

Thread-safety: :class:`Follower` is used by its own thread; :meth:`stop`
may be called from any thread.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time

from raylog.config import LEADER_START_GRACE_MS
from raylog.errors import OffsetOutOfRangeError, RaylogError, UnknownTopicError
from raylog.replication.follower_reads import ServedWatermark
from raylog.replication.leader import replica_sets_bytes
from raylog.replication.liveness import clear_dead_leader
from raylog.replication.state import read_state, take_over
from raylog.retry import RetryPolicy
from raylog.storage.owner_only import private_opener
from raylog.storage.producer_state import RECORD_SIZE, parse_records
from raylog.storage.record_batch import LOG_OVERHEAD, format_at
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES

log = logging.getLogger(__name__)

#: how long one fetch waits at the leader for new bytes
FETCH_WAIT_MS = 500
#: a fetch without a reply for this long (beyond FETCH_WAIT_MS) fails
FETCH_TIMEOUT_S = 10.0
#: a follower's connect to its leader waits this long (a leader host cut off is
#: tried again soon, so that the follower is ready when its session expires)
CONNECT_TIMEOUT_S = 1.0
_SIZE = struct.Struct(">I")
#: the file in a replica's log directory holding the leader epoch of its data
EPOCH_FILE = "leader-epoch"


def start_over_if_behind(partition_log, offset: int, err: OffsetOutOfRangeError, who: str) -> bool:
    """When the leader's log now starts past ``offset`` (its retention
    deleted what this replica would fetch next: a replica away long, or a
    new one), start the replica's log over, empty, at the leader's log start
    and say so; False for any other out-of-range answer."""
    earliest = getattr(err, "earliest", None)
    if not isinstance(earliest, int) or earliest <= offset:
        return False
    log.warning("replica %s starts over at %d: the leader's log no longer holds %d..%d", who, earliest, offset,
                earliest)
    partition_log.restart_replica_at(earliest)
    return True


def read_epoch(directory: str) -> int:
    try:
        with open(os.path.join(directory, EPOCH_FILE)) as f:
            return int(f.read().strip() or 0)
    except FileNotFoundError:
        return 0


def write_epoch(directory: str, epoch: int) -> None:
    path = os.path.join(directory, EPOCH_FILE)
    with open(path + ".tmp", "w", opener=private_opener) as f:
        f.write(str(epoch))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def whole_messages(data) -> int:
    """The length of the longest prefix of ``data`` made of whole entries:
    format-1 messages (a 4-byte big-endian size, then that many bytes) or
    format-2 record batches (12 + batchLength bytes; docs/design.md §2)."""
    pos, end = 0, len(data)
    while pos + 17 <= end:  # (every entry is longer: 17 bytes tell its format)
        if format_at(data, pos) == 2:
            size = LOG_OVERHEAD + _SIZE.unpack_from(data, pos + 8)[0]
        else:
            size = 4 + _SIZE.unpack_from(data, pos)[0]
        if pos + size > end:
            break
        pos += size
    return pos


def replicable(offset: int, length: int, records, full: bool) -> tuple[int, list]:
    """How much of ``length`` fetched bytes (whole messages from ``offset``)
    to append, and the producers' sets completed within it, from
    ``records`` (the leader's sets that end after ``offset``, in base-offset
    order; ``full``: there may be more than these).

    The bytes are cut before a set that begins in them and reaches past
    them (the next fetch starts at it), so that a replica holds whole sets
    only, but for a set larger than one fetch: that one is appended in
    parts, and it is remembered with the part that completes it (its record
    comes with every fetch from inside it). A record without sets (the
    sequence the leader learnt a producer at, before its first remembered
    set) goes with that set. When the records were cut
    short, the bytes are cut after the last set described, so that no set
    ends in them unrecorded."""
    end = offset + length
    if full and records:
        end = min(end, records[-1][3] + sum(records[-1][4]))
    for record in records:
        base = record[3]
        if offset < base < end < base + sum(record[4]):
            end = base
            break
    kept = []
    for k, record in enumerate(records):
        if record[4]:
            if offset < record[3] + sum(record[4]) <= end:
                kept.append(record)
        elif k + 1 < len(records) and records[k + 1][0] == record[0] and (
                offset < records[k + 1][3] + sum(records[k + 1][4]) <= end):
            kept.append(record)  # where the leader learnt the producer, with its first remembered set
    return end - offset, kept


def spanning(offset: int, length: int, records):
    """The record (of ``records``, as :func:`replicable` takes them) of the
    set that the ``length`` bytes appended at ``offset`` hold the first
    part of and that reaches past them (a set larger than one fetch), or
    ``None``."""
    end = offset + length
    for record in records:
        if record[3] < end < record[3] + sum(record[4]):
            return record
    return None


class Follower:
    """Replicates one partition from its leader (see the module docstring)."""

    def __init__(self, registry, topic: str, partition: int, node: str, partition_log, token: bytes,
                 on_promoted=None):
        self.registry, self.topic, self.partition, self.node = registry, topic, partition, node
        self.log, self._token, self._on_promoted = partition_log, token, on_promoted
        self.epoch = read_epoch(partition_log.directory)
        self._missing_since: float | None = None  # since when no leader serves
        #: the leader epoch whose leader was seen serving (its endpoint registered)
        self._served_epoch: int | None = None
        #: the leader epoch whose leader the last connection failed to
        self._failed_epoch: int | None = None
        self._stopped = threading.Event()
        self.fetched_bytes = 0
        #: the leader's committed offset as its replies say (what this replica serves readers up to)
        self.watermark = ServedWatermark()
        self._thread = threading.Thread(target=self._run, name="raylog-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopped.set()
        self.watermark.close()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        backoff = RetryPolicy.forever(delay_s=0.05, max_delay_s=0.5).start()
        while not self._stopped.is_set():
            try:
                self._follow(backoff)
            except (RaylogError, OSError) as err:
                log.info("follower %s of %s-%d: %s; retrying", self.node, self.topic, self.partition, err)
            except Exception:  # noqa: BLE001 - the thread must go on following
                log.exception("follower %s of %s-%d failed; retrying", self.node, self.topic, self.partition)
            backoff.wait(self._stopped)

    def _state(self, zk, paths):
        """The partition's replication state and its version; UnknownTopicError
        (retried quietly by the loop until the actor is stopped) when the
        topic was deleted under this replica."""
        found = read_state(zk, paths, self.topic, self.partition)
        if found is None:
            raise UnknownTopicError(f"{self.topic}-{self.partition} has no replication state in ZooKeeper (the "
                                    f"topic was deleted); the follower waits to be stopped")
        return found

    def _follow(self, backoff) -> None:
        zk, paths = self.registry.zk, self.registry.paths
        state, _ = self._state(zk, paths)
        if state.leader_epoch > self.epoch:
            boundary = state.boundary_after(self.epoch)
            if boundary is not None and boundary < self.log.log_end_offset:
                log.warning("replica %s of %s-%d truncates %d..%d (data of leader epoch %d)", self.node,
                            self.topic, self.partition, boundary, self.log.log_end_offset, self.epoch)
                self.log.truncate_replica(boundary)
            if boundary is not None:
                # what a former leader committed past the new epoch's start is gone (an unclean election)
                self.watermark.cap(boundary)
            self.epoch = state.leader_epoch
            write_epoch(self.log.directory, self.epoch)
        if state.leader == self.node and self._on_promoted is not None:
            # the state names this replica (a handoff to it): it leads at once
            # (the state is read before the thread ends: ZooKeeper away here
            # is retried by the loop, not a lead that nobody takes)
            found = self._state(zk, paths)
            self._stopped.set()
            self._on_promoted(*found)
            return
        endpoint = self.registry.endpoint(self.topic, self.partition)
        epoch = state.leader_epoch
        if endpoint is not None and state.leader != self.node and self._failed_epoch == epoch:
            # the last connection to this leader failed: a refused connect says its process is gone
            if clear_dead_leader(zk, paths, self.topic, self.partition, state.leader):
                endpoint, self._served_epoch = None, epoch
            self._failed_epoch = None
        if endpoint is not None and state.leader != self.node:
            self._missing_since = None
            self._served_epoch = epoch
        elif self._missing_since is None and self._served_epoch != epoch:
            self._missing_since = time.monotonic()  # a leader still starting up gets replica_lag_ms
        elif self._served_epoch == epoch or (
                (time.monotonic() - self._missing_since) * 1000
                >= max(self.log.config.replica_lag_ms, LEADER_START_GRACE_MS)):
            # a leader that served and is gone (its session ended or expired, or its process
            # died) is replaced at once; one never seen serving, after the start grace.
            # A set held only in part is cut back first: its producer resends it whole.
            self.log.cut_partial_replica_set()
            won = take_over(zk, paths, self.topic, self.partition, self.node, self.log.log_end_offset,
                            unclean=self.log.config.unclean_leader_election)
            if won is not None and self._on_promoted is not None:
                write_epoch(self.log.directory, won[0].leader_epoch)
                self._stopped.set()
                self._on_promoted(*won)
                return
        if endpoint is None or state.leader == self.node:
            return
        try:
            self._fetch_from(endpoint, backoff)
        except (RaylogError, OSError):
            self._failed_epoch = epoch
            raise

    def _watch_endpoint(self, conn) -> None:
        """End ``conn`` (its blocked fetch raises ClosedError) once the
        partition's endpoint changes or goes: a leader whose session expired
        (a host cut off) is replaced the moment ZooKeeper says so, not after
        a socket timeout."""

        def changed(event) -> None:
            if event.type != "NONE":
                conn.close()

        self.registry.zk.exists(self.registry.paths.endpoint(self.topic, self.partition), watch=changed)

    def _fetch_from(self, endpoint: dict, backoff) -> None:
        max_bytes = self.log.config.max_message_bytes
        with BrokerConnection(
            endpoint["host"], endpoint["port"], token=self._token, timeout_s=FETCH_TIMEOUT_S,
            connect_timeout_s=CONNECT_TIMEOUT_S, max_frame_bytes=max_bytes + FRAME_OVERHEAD_BYTES,
        ) as conn:
            self._watch_endpoint(conn)
            while not self._stopped.is_set():
                offset = self.log.log_end_offset
                try:
                    # (this replica flushes before it asks: its log end is its flushed end)
                    reply = conn.replica_fetch(self.topic, self.partition, self.node, self.epoch, offset,
                                               min(offset, self.log.high_watermark), max_bytes, FETCH_WAIT_MS)
                except OffsetOutOfRangeError as err:
                    if not start_over_if_behind(self.log, offset, err, f"{self.node} of {self.topic}-{self.partition}"):
                        raise
                    continue
                length = whole_messages(reply.data)
                if length:
                    records = parse_records(reply.sets)
                    length, sequences = replicable(offset, length, records,
                                                   full=len(reply.sets) + RECORD_SIZE > replica_sets_bytes(max_bytes))
                    self.log.append_replica(bytes(reply.data[:length]), offset, sequences,
                                            spanning(offset, length, records))
                    self.log.flush()
                    self.fetched_bytes += length
                self.watermark.learn(reply.high_watermark)
                if reply.log_start_offset > self.log.log_start_offset:
                    # the leader's records before its start were deleted (delete_records): so are this
                    # replica's, as far as it holds them (the rest at a later fetch)
                    self.log.advance_log_start(reply.log_start_offset)
                if length:
                    self.watermark.notify()
                backoff.reset()
