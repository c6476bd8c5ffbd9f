"""Read-your-writes for acks=1: ``flush()`` returns when what was sent can be read.

With acks=1 a partition acknowledges a set once it is appended to its log;
the set becomes readable when the partition next flushes (``flush_messages``
/ ``flush_ms``, docs/design.md section 3) and its high watermark passes it.
docs/design.md section 6 promises more of ``producer.flush()``: with acks=1
or "all" it returns only when everything sent can be read. acks="all" gets
it from the partition (its reply comes once the set is flushed and below
the high watermark); for acks=1, :class:`Visibility` does it on the
producer's side, off the streaming path:

* the sender notes, per topic-partition, the highest base offset it was
  acknowledged (:meth:`Visibility.note`: one comparison under a lock per
  set);
* ``flush()`` then asks each partition written to since the last flush to
  wait until its high watermark passes that offset: a FETCH at the offset
  with a long poll (``max wait ms``) and ``max bytes`` 1, on a connection
  of its own (the sender's belong to its workers). A waiting reader makes
  the partition flush at once rather than after ``flush_ms``
  (:meth:`raylog.storage.log.PartitionLog.wait_for_data`), so the wait is
  a sync's length, and the reply's high watermark says it is done. No new
  request type: the data channel's FETCH already is this wait.

A partition that cannot be reached is asked again (its endpoint looked up
anew) until the deadline; past it :class:`RequestTimeoutError` names the
partitions whose data is not readable yet.

Thread-safety: :meth:`note` may be called from any thread (the sender's
workers, a caller's direct round); :meth:`wait` from any thread, one at a
time (a lock serialises them: its connections are used by one wait only).
"""

from __future__ import annotations

import threading
import time

from raylog.errors import OffsetOutOfRangeError, RaylogError, RequestTimeoutError
from raylog.transfer.connection import BrokerConnection

#: the longest single long poll of a wait (the partition caps it too); a
#: poll that ends without the data is simply made again until the deadline
POLL_MS = 1000
#: pause before asking a partition that could not be reached again
RETRY_PAUSE_S = 0.05


class Visibility:
    """The acknowledged offsets of an acks=1 producer and the wait until
    they are readable (see the module docstring)."""

    def __init__(self, metadata, request_timeout_s: float):
        self._metadata = metadata
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()  # _acked, _readable
        #: (topic, partition) -> the highest base offset acknowledged
        self._acked: dict[tuple[str, int], int] = {}
        #: (topic, partition) -> an offset known readable (below the high watermark)
        self._readable: dict[tuple[str, int], int] = {}
        self._wait_lock = threading.Lock()  # one wait at a time; guards _connections
        self._connections: dict[tuple[str, int], BrokerConnection] = {}

    def note(self, topic: str, partition: int, base: int) -> None:
        """The set at ``base`` of ``topic``-``partition`` was acknowledged."""
        if base < 0:
            return
        tp = (topic, partition)
        with self._lock:
            if base > self._acked.get(tp, -1):
                self._acked[tp] = base

    def wait(self, deadline: float | None) -> None:
        """Block until every set acknowledged so far is below its
        partition's high watermark; ``deadline`` (``time.monotonic()``) or,
        if None, ``request_timeout_s`` from now. RequestTimeoutError past it."""
        if deadline is None:
            deadline = time.monotonic() + self.request_timeout_s
        with self._lock:
            todo = {tp: base for tp, base in self._acked.items() if self._readable.get(tp, -1) < base}
        if not todo:
            return
        with self._wait_lock:
            late = []
            for tp, base in todo.items():
                if not self._wait_one(tp, base, deadline):
                    late.append(f"{tp[0]}-{tp[1]} (offset {base})")
        if late:
            raise RequestTimeoutError(
                f"flush: the partitions acknowledged the messages but did not make them readable in time: "
                f"{', '.join(late)}; they become readable at the partition's next flush (is it busy or moving?)"
            )

    def _wait_one(self, tp: tuple[str, int], base: int, deadline: float) -> bool:
        """Whether ``tp``'s high watermark passed ``base`` before ``deadline``."""
        topic, partition = tp
        offset = base  # where the long poll waits: the set, or the high watermark below it
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                conn = self._connection(tp)
                result = conn.fetch(topic, partition, offset, 1, max_wait_ms=max(1, min(POLL_MS, int(left * 1000))))
                high_watermark = result.high_watermark
            except OffsetOutOfRangeError as err:
                earliest, latest = err.details.get("earliest"), err.details.get("latest")
                if isinstance(earliest, int) and base < earliest:
                    high_watermark = earliest  # retention removed it since: it was readable
                elif isinstance(latest, int) and latest < base:
                    # The set is past the high watermark (not flushed yet): wait
                    # at the high watermark, which makes the partition flush now.
                    offset = latest
                    continue
                else:
                    raise
            except RaylogError as err:
                if not err.retriable:
                    raise
                self._reset(tp)  # the partition moved or restarted: look it up again
                time.sleep(min(RETRY_PAUSE_S, max(0.0, deadline - time.monotonic())))
                continue
            if high_watermark > base:
                with self._lock:
                    if high_watermark - 1 > self._readable.get(tp, -1):
                        self._readable[tp] = high_watermark - 1  # every offset below it is readable
                return True
            offset = min(base, max(offset, high_watermark))

    def _connection(self, tp: tuple[str, int]) -> BrokerConnection:
        conn = self._connections.get(tp)
        if conn is None:
            host, port = self._metadata.endpoint(*tp, wait_s=1.0)
            conn = self._connections[tp] = BrokerConnection(
                host, port, token=self._metadata.settings.token, timeout_s=self.request_timeout_s)
        if not conn.connected:
            conn.connect()
        return conn

    def _reset(self, tp: tuple[str, int]) -> None:
        conn = self._connections.pop(tp, None)
        if conn is not None:
            conn.close()
        self._metadata.forget(*tp)

    def close(self) -> None:
        with self._wait_lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()
