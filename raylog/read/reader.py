"""Range readers, run wherever the work runs (Spark executors, Ray tasks):
fetch a range over TCP, check every CRC, yield Arrow batches, follow a
partition actor that moved, and handle data lost to retention (see
:mod:`raylog.read`).

A range of a replicated partition may be read from a follower
(:mod:`raylog.read.replicas` chooses which): the reader asks it with a
bounded long poll (:data:`FOLLOWER_WAIT_MS`), and on any error of the
follower (not serving, behind, gone, a bad reply) reads the rest of the
range from the leader, within the read's usual bounds. A replicated leader
whose reply is empty below the range's end (a new leader learning its
followers' ends after a failover) is asked again with long polls for up to
:data:`LEADER_CATCH_UP_S` before that counts as lost data.

A ``read_committed`` range (docs/design.md §6; planned up to the last
stable offset) is read from the leader alone (a follower does not serve
such reads) with FETCH version 1: the records of the aborted transactions
the replies name are dropped (:mod:`raylog.storage.aborted_reads`), markers
are never rows."""

from __future__ import annotations

import logging
import time
from typing import Iterator, Sequence

import pyarrow as pa

from raylog.config import MiB
from raylog.errors import (
    BrokerUnavailableError,
    DataLossError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    RaylogError,
)
from raylog.metadata import ConnectionSettings, Metadata
from raylog.read.ranges import BATCH_BYTES, FETCH_BYTES, LostRange, RECONNECT_DEADLINE_S, ReadPlan, ReadRange, records_to_batch
from raylog.read.replicas import Replica, local_replica, where_am_i
from raylog.retry import RetryPolicy
from raylog.storage.aborted_reads import aborted_ranges
from raylog.storage.decoding import decode_messages
from raylog.transfer.protocol import READ_COMMITTED
from raylog.storage.record_batch import format_at, next_offset_after

log = logging.getLogger(__name__)

#: ``read_range(replica=LOCAL)``: the candidate on the reader's node or host, else the leader
LOCAL = "local"
#: how long one fetch from a follower waits for it to serve the offset (to learn the high watermark)
FOLLOWER_WAIT_MS = 2000
#: how long a replicated leader's empty replies below a range's end are waited out (long polls)
LEADER_CATCH_UP_S = 30.0
#: the long poll of a fetch that waits for a leader to catch up
_CATCH_UP_WAIT_MS = 500


def choose_replica(rng: ReadRange, replica: str | None = LOCAL) -> Replica | None:
    """The follower ``rng`` is read from, or None for the leader: ``replica``
    is :data:`LOCAL` (:func:`~raylog.read.replicas.local_replica` of this
    process's node), a node identity (that candidate, if it is one), or None
    (the leader)."""
    if replica is None or len(rng.replicas) < 2:
        return None
    if replica == LOCAL:
        chosen = local_replica(rng.replicas, *where_am_i())
    else:
        chosen = next((r for r in rng.replicas if r.node == replica), None)
    return None if chosen is None or chosen.leader else chosen


class _Endpoint:
    """The connection a range reader uses: a follower while it serves (see
    the module docstring), else the leader, refreshed from ZooKeeper when the
    partition actor moved since the plan was made."""

    def __init__(self, settings: ConnectionSettings, rng: ReadRange, timeout_s: float, max_message_bytes: int,
                 follower: Replica | None = None):
        self.settings, self.rng, self.timeout_s = settings, rng, timeout_s
        self.max_message_bytes = max_message_bytes
        self.follower = follower
        self.host, self.port = (follower.host, follower.port) if follower is not None else (rng.host, rng.port)
        self.conn = None

    def leave_follower(self, offset: int, why) -> None:
        """Read the rest of the range from the leader."""
        log.info("reading %s-%d at %d from the follower %s: %s; reading from the leader", self.rng.topic,
                 self.rng.partition, offset, self.follower.node, why)
        self.close()
        self.follower = None
        self.host, self.port = self.rng.host, self.rng.port

    def connection(self):
        if self.conn is None:
            self.conn = self.settings.broker_connection(
                self.host, self.port, timeout_s=self.timeout_s, max_message_bytes=self.max_message_bytes
            )
        return self.conn

    def refresh(self) -> None:
        self.close()
        metadata = Metadata.connect(self.settings)
        try:
            self.host, self.port = metadata.endpoint(self.rng.topic, self.rng.partition, refresh=True, wait_s=5.0)
        finally:
            metadata.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def read_range(
    rng: ReadRange,
    settings: ConnectionSettings,
    *,
    fail_on_data_loss: bool = True,
    fetch_bytes: int = FETCH_BYTES,
    batch_bytes: int = BATCH_BYTES,
    max_message_bytes: int = 1 * MiB,
    reconnect_deadline_s: float = RECONNECT_DEADLINE_S,
    timeout_s: float = 30.0,
    lost: list | None = None,
    replica: str | None = LOCAL,
    isolation_level: str = "read_uncommitted",
) -> Iterator[pa.RecordBatch]:
    """The messages of ``rng`` (format 1 and format 2 alike, docs/design.md
    §2) as RecordBatches of :data:`ARROW_SCHEMA`,
    each gathered from fetches of up to ``fetch_bytes`` until it holds about
    ``batch_bytes`` of log.

    A partition actor that restarted or moved is found again through
    ZooKeeper, for up to ``reconnect_deadline_s``. Bytes that retention
    deleted since planning raise :class:`DataLossError`, or with
    ``fail_on_data_loss=False`` are skipped, logged and appended to ``lost``.

    ``replica``: which candidate of a replicated range to read from
    (:func:`choose_replica`: by default the one on this node, else the
    leader; None: the leader). A follower that fails or lags is left for
    the leader; never a byte past ``rng.end`` is read.

    ``isolation_level="read_committed"``: from the leader, without the
    records of aborted transactions (module docstring).
    """
    topic, partition, end = rng.topic, rng.partition, rng.end
    committed = isolation_level == "read_committed"
    isolation = READ_COMMITTED if committed else None
    endpoint = _Endpoint(settings, rng, timeout_s, max_message_bytes,
                         None if committed else choose_replica(rng, replica))
    replicated = len(rng.replicas) > 1
    catch_up_until = None  # a replicated leader's empty replies are waited out until then
    offset = rng.start
    # a partition actor that moved or restarts: back off 0.05 s doubling to 1 s,
    # for up to reconnect_deadline_s since the first failure in a row
    backoff = RetryPolicy.until(reconnect_deadline_s, max_delay_s=1.0).start()
    failing = False
    pending: list = []
    pending_from = offset
    try:
        while offset < end:
            if pending and offset - pending_from >= batch_bytes:
                yield records_to_batch(pending, topic, partition)
                pending, pending_from = [], offset
            want = min(fetch_bytes, end - offset)
            if endpoint.follower is not None:
                try:
                    result = endpoint.connection().fetch(topic, partition, offset, want, FOLLOWER_WAIT_MS,
                                                         inside_wrapper=True)
                    if not result.data:
                        raise BrokerUnavailableError(f"nothing served within {FOLLOWER_WAIT_MS} ms (behind)")
                    at = data_start(result.data, result.offset)
                    records, consumed = decode_messages(result.data, at, max_message_bytes=max_message_bytes)
                    if not consumed:
                        raise InvalidMessageError("no whole message in the reply", offset=offset)
                except (RaylogError, OSError) as err:
                    endpoint.leave_follower(offset, err)
                    continue
                offset = next_offset(result.data, at, consumed)
                pending.extend(_within(records, rng.start, end))
                continue
            try:
                wait_ms = _CATCH_UP_WAIT_MS if catch_up_until is not None else 0
                result = endpoint.connection().fetch(topic, partition, offset, want, wait_ms, inside_wrapper=True,
                                                     isolation=isolation)
            except OffsetOutOfRangeError as err:
                if offset >= err.earliest:
                    raise DataLossError(
                        f"{topic}-{partition} ends at {err.latest} but the plan reads it up to {end}: "
                        f"the log lost flushed data since it was planned",
                        topic=topic, partition=partition, lost_start=max(offset, err.latest), lost_end=end,
                        offset=offset, earliest=err.earliest, latest=err.latest,
                    ) from None
                gone = LostRange(topic, partition, offset, min(end, err.earliest), err.earliest)
                if fail_on_data_loss:
                    raise DataLossError(
                        f"offsets {gone.describe()} were deleted by retention after the read was planned; "
                        f"plan the read again, or pass fail_on_data_loss=False to skip what was lost",
                        topic=topic, partition=partition, lost_start=gone.start, lost_end=gone.end,
                        offset=offset, earliest=err.earliest, latest=err.latest,
                    ) from None
                log.warning("reading %s: skipping lost %s", topic, gone.describe())
                if lost is not None:
                    lost.append(gone)
                offset = gone.end
                continue
            except RaylogError as err:
                if not err.refresh_metadata:
                    raise
                if not failing:
                    backoff.reset()
                    failing = True
                log.info("reading %s-%d at %d: %s; finding the partition again", topic, partition, offset, err)
                if not backoff.wait():
                    raise
                try:
                    endpoint.refresh()
                except BrokerUnavailableError:
                    pass
                continue
            failing = False
            data = result.data
            served = result.last_stable_offset if committed else result.high_watermark
            if not data and replicated and served <= offset:
                # a leader that does not serve this far yet (one that took over learns its followers' ends)
                if catch_up_until is None:
                    catch_up_until = time.monotonic() + LEADER_CATCH_UP_S
                if time.monotonic() < catch_up_until:
                    continue
            if not data:
                raise DataLossError(
                    f"{topic}-{partition} has nothing at {offset} although the plan reads it up to {end}: "
                    f"the log lost flushed data since it was planned",
                    topic=topic, partition=partition, lost_start=offset, lost_end=end,
                    offset=offset, earliest=result.log_start_offset, latest=result.high_watermark,
                )
            at = data_start(data, result.offset)
            records, consumed = decode_messages(data, at, max_message_bytes=max_message_bytes)
            if not consumed:
                raise InvalidMessageError(
                    f"the fetch of {topic}-{partition} at {offset} returned no whole message", offset=offset
                )
            offset = next_offset(data, at, consumed)
            dropped = aborted_ranges(data, result.aborted) if committed else ()
            if dropped:
                records = [r for r in records if not any(start <= r[0] < stop for start, stop in dropped)]
            pending.extend(_within(records, rng.start, end))
            catch_up_until = None
        if pending:
            yield records_to_batch(pending, topic, partition)
    finally:
        endpoint.close()


def data_start(data, offset: int) -> int:
    """Where fetched ``data`` starts in the log. A fetch at a record's offset
    inside a format-2 batch is answered with the whole batch from its start
    and the offset asked for; the batch's baseOffset is its start
    (docs/design.md §2). A fetch at an offset the log cleaner removed
    (a compacted topic, §3) is answered from the next kept batch: its
    baseOffset, past the offset asked for. Format 1 (and a wrapper, answered
    with its own offset): ``offset``."""
    if len(data) >= 17 and data[8] == 0 and format_at(data) == 2:
        return int.from_bytes(data[:8], "big")
    return offset


def next_offset(data, at: int, consumed: int) -> int:
    """Where a read continues after the ``consumed`` bytes of whole messages
    at the start of ``data`` (which starts at offset ``at``): for record
    batches the last one's baseOffset + lastOffsetDelta + 1 (in a segment the
    cleaner rewrote, bytes and offsets differ: docs/design.md §3), else
    ``at + consumed`` (offsets are byte positions, §2)."""
    if consumed and len(data) >= 17 and data[8] == 0 and format_at(data) == 2:
        after = next_offset_after(data, consumed)
        if after is not None:
            return after
    return at + consumed


def _within(records: list, start: int, end: int) -> list:
    """The records whose offsets lie in ``[start, end)``: a range may start or
    end at the record offset of an inner message of a compressed wrapper,
    which is fetched whole (docs/design.md §2)."""
    if records and (records[0][0] < start or records[-1][0] >= end):
        return [r for r in records if start <= r[0] < end]
    return records


def read_ranges(
    ranges: Sequence[ReadRange], settings: ConnectionSettings, **options
) -> Iterator[pa.RecordBatch]:
    """:func:`read_range` over several ranges, one after the other."""
    for rng in ranges:
        yield from read_range(rng, settings, **options)


def head_values(plan: ReadPlan, limit: int) -> list[bytes]:
    """The values of the first ``limit`` messages of ``plan`` (range by range),
    read directly by the caller; for schema inference on the driver."""
    values: list[bytes] = []
    for rng in plan.ranges:
        for batch in read_range(
            rng,
            plan.settings,
            fail_on_data_loss=False,
            fetch_bytes=min(FETCH_BYTES, 256 * limit + 4096),
            batch_bytes=1,
            max_message_bytes=plan.max_message_bytes,
        ):
            values.extend(batch.column(1).to_pylist()[: limit - len(values)])
            if len(values) >= limit:
                return values
    return values
