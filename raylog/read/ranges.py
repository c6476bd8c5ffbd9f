"""What a bounded read is made of: the Arrow schema of every read (the
columns of Spark's Kafka source), the read plan and its byte ranges, lost
ranges, and records as an Arrow batch (see :mod:`raylog.read`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Mapping, NamedTuple

import pyarrow as pa

from raylog.config import MiB
from raylog.metadata import ConnectionSettings


#: a headers column: each record's headers in order, duplicates kept (Spark's
#: Kafka source with includeHeaders); a header's value is null when sent as null
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))

#: the columns of every bounded read (Spark's Kafka source, as Arrow; ``value``
#: is null for a format-2 tombstone, ``headers`` an empty list for format 1)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("headers", HEADERS_TYPE),
    ]
)

#: bytes asked for by one fetch of a range reader (a partition's data server
#: sends at most about its topic's max_message_bytes per reply)
FETCH_BYTES = 8 * MiB
#: a range reader gathers the messages of several fetches into Arrow batches
#: of about this many bytes (fewer, larger batches cost Spark less per row)
BATCH_BYTES = 8 * MiB
#: how long a range reader keeps trying to reach a partition that moved or restarts
RECONNECT_DEADLINE_S = 60.0

#: the label every Ray node carries with its node id
NODE_ID_LABEL = "ray.io/node-id"

EARLIEST = -2
LATEST = -1
NAMED_OFFSETS = {"earliest": EARLIEST, "latest": LATEST}


class ReadRange(NamedTuple):
    """One piece of work: bytes ``[start, end)`` of a partition, both message
    boundaries. ``host``/``port`` is the partition's data socket (its leader)
    when planned, ``node_id``/``node_ip`` the Ray node of that leader: the node
    that serves the range (None when unknown); ``replicas`` the candidates
    that may serve it, leader first (:class:`raylog.read.replicas.Replica`;
    empty: the leader alone)."""

    topic: str
    partition: int
    start: int
    end: int
    host: str
    port: int
    node_id: str | None = None
    node_ip: str | None = None
    replicas: tuple = ()

    @property
    def size(self) -> int:
        return self.end - self.start


class LostRange(NamedTuple):
    """Bytes ``[start, end)`` of a partition that retention deleted before the read."""

    topic: str
    partition: int
    start: int
    end: int
    earliest: int

    def describe(self) -> str:
        return (
            f"{self.topic}-{self.partition} [{self.start}, {self.end}) ({self.end - self.start} bytes; "
            f"the log now starts at {self.earliest})"
        )


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """What a bounded read returns: fixed byte ranges of one topic.

    ``start_offsets``/``end_offsets``: per partition, where the read starts
    (after skipping lost data) and ends; ``high_watermarks``/``log_starts``:
    what the partitions reported when the plan was made; ``lost``: ranges
    skipped because retention deleted them (``fail_on_data_loss=False``).
    """

    topic: str
    settings: ConnectionSettings
    ranges: tuple[ReadRange, ...]
    start_offsets: Mapping[int, int]
    end_offsets: Mapping[int, int]
    log_starts: Mapping[int, int]
    high_watermarks: Mapping[int, int]
    lost: tuple[LostRange, ...] = ()
    fail_on_data_loss: bool = True
    max_message_bytes: int = 1 * MiB
    planned_at: float = dataclasses.field(default_factory=time.time)
    #: ``"read_committed"``: ends at the last stable offsets, read without aborted records (docs/design.md §6)
    isolation_level: str = "read_uncommitted"

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.ranges)

    def report(self) -> dict:
        """A summary for logs: ranges, bytes, and what was skipped as lost."""
        return {
            "topic": self.topic,
            "ranges": len(self.ranges),
            "bytes": self.total_bytes,
            "start_offsets": dict(self.start_offsets),
            "end_offsets": dict(self.end_offsets),
            "lost": [r._asdict() for r in self.lost],
        }


def records_to_batch(records: list, topic: str, partition: int) -> pa.RecordBatch:
    """``decode_messages`` records ``(offset, timestamp_ms, key, value)`` as a
    RecordBatch of :data:`ARROW_SCHEMA` (a format-2 record's ``headers``
    attribute, :class:`~raylog.storage.decoding.HeadedRecord`, fills its
    headers; other records get an empty list; a ``None`` value is null)."""
    import numpy as np  # heavy: imported when used

    n = len(records)
    if any(getattr(r, "headers", None) for r in records):
        headers = pa.array([[{"key": k, "value": v} for k, v in getattr(r, "headers", ())] for r in records],
                           HEADERS_TYPE)
    else:  # n empty lists (every format-1 read), without a Python list each
        headers = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)),
                                           pa.array([], HEADERS_TYPE.value_type))
    keys = [r[2] for r in records]
    ts = np.fromiter([r[1] for r in records], dtype=np.int64, count=n)
    ts *= 1000
    columns = [
        pa.nulls(n, pa.binary()) if keys.count(None) == n else pa.array(keys, pa.binary()),
        pa.array([r[3] for r in records], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(np.fromiter([r[0] for r in records], dtype=np.int64, count=n)),
        pa.array(ts, pa.timestamp("us", tz="UTC")),
        headers,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
