"""Range readers, run wherever the work runs (Spark executors, Ray tasks):
fetch a range over TCP, check every CRC, yield Arrow batches, follow a
partition actor that moved, and handle data lost to retention (see
:mod:`raylog.read`)."""

from __future__ import annotations

import logging
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
from raylog.retry import RetryPolicy
from raylog.storage.decoding import decode_messages

log = logging.getLogger(__name__)


class _Endpoint:
    """The connection a range reader uses, refreshed from ZooKeeper when the
    partition actor moved since the plan was made."""

    def __init__(self, settings: ConnectionSettings, rng: ReadRange, timeout_s: float, max_message_bytes: int):
        self.settings, self.rng, self.timeout_s = settings, rng, timeout_s
        self.max_message_bytes = max_message_bytes
        self.host, self.port = rng.host, rng.port
        self.conn = None

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
) -> Iterator[pa.RecordBatch]:
    """The messages of ``rng`` as RecordBatches of :data:`ARROW_SCHEMA`,
    each gathered from fetches of up to ``fetch_bytes`` until it holds about
    ``batch_bytes`` of log.

    A partition actor that restarted or moved is found again through
    ZooKeeper, for up to ``reconnect_deadline_s``. Bytes that retention
    deleted since planning raise :class:`DataLossError`, or with
    ``fail_on_data_loss=False`` are skipped, logged and appended to ``lost``.
    """
    topic, partition, end = rng.topic, rng.partition, rng.end
    endpoint = _Endpoint(settings, rng, timeout_s, max_message_bytes)
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
            try:
                result = endpoint.connection().fetch(topic, partition, offset, min(fetch_bytes, end - offset), 0)
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
            if not data:
                raise DataLossError(
                    f"{topic}-{partition} has nothing at {offset} although the plan reads it up to {end}: "
                    f"the log lost flushed data since it was planned",
                    topic=topic, partition=partition, lost_start=offset, lost_end=end,
                    offset=offset, earliest=result.log_start_offset, latest=result.high_watermark,
                )
            records, consumed = decode_messages(data, offset, max_message_bytes=max_message_bytes)
            if not consumed:
                raise InvalidMessageError(
                    f"the fetch of {topic}-{partition} at {offset} returned no whole message", offset=offset
                )
            offset += consumed
            pending.extend(records)
        if pending:
            yield records_to_batch(pending, topic, partition)
    finally:
        endpoint.close()


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
