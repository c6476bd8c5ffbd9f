"""The outcome of a send: futures resolving to ``(partition, offset)``.

One :class:`BatchFuture` per batch (one message set on the wire) is shared
by its messages; ``send`` hands out a :class:`SendFuture`, a two-slot view
of it (the batch and the message's index), so that the hot path allocates
almost nothing per message. ``send_batch`` hands out a :class:`CallFuture`
over the batches its messages went to.

Offsets (docs/design.md §2): a batch travels as one record batch, and
message ``i`` of it has the batch's offset (its byte position) plus ``i``. With ``acks=0`` nothing comes
back and every message reports offset ``-1``, as does a set the partition
recognised as a duplicate it can no longer place (DuplicateSequenceError).

A failed batch raises, from each of its futures, a typed error whose
message starts with the topic-partition and whose ``topic`` and
``partition`` attributes name it.

Thread-safety: futures are resolved once, by the producer's sender, and
may be read and waited for from any thread; callbacks run on the thread
that resolves the future (or at once, on the caller's, if it is done).
"""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple

from raylog.errors import DeliveryError, RaylogError, RequestTimeoutError

try:  # puts a future the compiled send left untracked back under the garbage collector
    from raylog.producer._fastsend import track
except ImportError:  # pragma: no cover - built without a compiler

    def track(obj) -> None:
        pass


#: guards the lazily made events and callback lists of every future
_WAIT_LOCK = threading.Lock()
#: the offset of a message whose place in the log is not known (acks=0)
UNKNOWN_OFFSET = -1


class RecordMetadata(NamedTuple):
    """Where a message was stored."""

    partition: int
    offset: int


def scoped_error(err: BaseException, topic: str, partition: int) -> RaylogError:
    """``err`` as the same typed error, its message naming the topic-partition
    and its details carrying ``topic`` and ``partition``."""
    if not isinstance(err, RaylogError):
        wrapped = RaylogError(f"{topic}-{partition}: {type(err).__name__}: {err}", topic=topic, partition=partition)
        wrapped.__cause__ = err
        return wrapped
    if getattr(err, "topic", None) == topic and getattr(err, "partition", None) == partition:
        return err
    cls = type(err)
    scoped = cls.__new__(cls)
    Exception.__init__(scoped, f"{topic}-{partition}: {err}")
    scoped.details = {**err.details, "topic": topic, "partition": partition}
    for name, value in scoped.details.items():
        setattr(scoped, name, value)
    scoped.__cause__ = err
    return scoped


class BatchFuture:
    """The outcome of one batch: the base offset of its message set, or the
    error it failed with. Resolved once by the sender."""

    __slots__ = ("topic", "partition", "_values", "_keys", "_compressed", "_done", "_base", "_offsets",
                 "_error", "_event", "_callbacks", "_reap")

    def __init__(self, topic: str, partition: int, values: list, compressed: bool):
        self.topic = topic
        self.partition = partition
        self._values = values  # the batch's own list (until resolved)
        self._keys = None
        self._compressed = compressed
        self._done = False
        self._base: int | None = None
        self._offsets: list[int] | None = None
        self._error: RaylogError | None = None
        self._event: threading.Event | None = None
        self._callbacks: list | None = None
        #: a direct round's reply reader: ``reap(read, timeout_s)`` reads the
        #: reply on the waiting thread (``read``) or hands the round to the sender
        self._reap = None

    # -- the sender's side ------------------------------------------------------

    def set_keys(self, keys) -> None:
        self._keys = keys

    def read_reply_with(self, reap: Callable[..., None]) -> None:
        """A direct round was written for this batch: ``reap(read,
        timeout_s=None)`` reads its reply on a waiting thread (``read``)
        or hands the round to the sender's worker. Called by the sender
        once, before any reader can see the round."""
        self._reap = reap

    def resolve(self, base_offset: int) -> None:
        self._base = base_offset
        self._values = self._keys = None
        self._finish()

    def fail(self, error: BaseException) -> None:
        track(self)  # (its error's traceback may lead back to it: a cycle the collector must see)
        self._error = scoped_error(error, self.topic, self.partition)
        self._values = self._keys = None
        self._finish()

    def _finish(self) -> None:
        self._reap = None
        self._done = True
        with _WAIT_LOCK:
            event, callbacks = self._event, self._callbacks
            self._callbacks = None
        if event is not None:
            event.set()
        if callbacks:
            for callback in callbacks:
                callback()

    # -- readers ------------------------------------------------------------------

    def done(self) -> bool:
        if not self._done and self._reap is not None:
            self._hand_over()
        return self._done

    def _hand_over(self) -> None:
        """A direct round's reply is left to the sender's worker (this
        thread will not read it: it polls, or registers a callback)."""
        reap = self._reap
        if reap is not None:
            self._reap = None
            reap(False)

    @property
    def error(self) -> RaylogError | None:
        return self._error

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until resolved; RequestTimeoutError after ``timeout_s``.

        A direct round's reply (:mod:`raylog.producer.accumulator`) is read
        here, on the waiting thread (once it starts to arrive within
        ``timeout_s``; else the round goes to the sender's worker)."""
        if self._done:
            return
        reap = self._reap
        if reap is not None:
            self._reap = None
            reap(True, timeout_s)
            if self._done:
                return
        with _WAIT_LOCK:
            if self._done:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout_s):
            raise RequestTimeoutError(
                f"{self.topic}-{self.partition}: no outcome within {timeout_s} s; the producer is still "
                "retrying (or was closed)"
            )

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once resolved (at once if it is)."""
        if not self._done:
            if self._reap is not None:
                self._hand_over()
            track(self)  # (a callback may lead back to it: a cycle the collector must see)
            with _WAIT_LOCK:
                if not self._done:
                    if self._callbacks is None:
                        self._callbacks = []
                    self._callbacks.append(callback)
                    return
        callback()

    def offset_of(self, index: int) -> int:
        """The offset of message ``index`` (the batch must be resolved)."""
        if self._error is not None:
            raise self._error
        base = self._base
        if base < 0:
            return base
        return base + index


class SendFuture:
    """The outcome of one ``send``: ``result()`` is ``(partition, offset)``
    or raises the typed error of the message's batch."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: BatchFuture, index: int):
        self._batch = batch
        self._index = index

    @property
    def topic(self) -> str:
        return self._batch.topic

    @property
    def partition(self) -> int:
        return self._batch.partition

    def done(self) -> bool:
        return self._batch.done()

    def result(self, timeout_s: float | None = None) -> RecordMetadata:
        batch = self._batch
        batch.wait(timeout_s)
        return RecordMetadata(batch.partition, batch.offset_of(self._index))

    def exception(self, timeout_s: float | None = None) -> RaylogError | None:
        self._batch.wait(timeout_s)
        return self._batch._error

    def add_done_callback(self, fn: Callable[["SendFuture"], None]) -> None:
        self._batch.on_done(lambda: fn(self))

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._batch._error else "done")
        return f"<SendFuture {self.topic}-{self.partition} {state}>"


class CallFuture:
    """The outcome of one ``send_batch``: every message of the call,
    wherever its batch went. ``result()`` lists ``(partition, offset)`` in
    the order of the call, or raises one :class:`~raylog.errors.DeliveryError`
    naming each failed topic-partition and how many of the call's messages
    it lost (the call's other messages are delivered)."""

    __slots__ = ("_parts", "_count")

    def __init__(self):
        #: (batch, first index in the batch, count, where in the call: the
        #: first position, or the list of positions of a keyed part)
        self._parts: list[tuple[BatchFuture, int, int, object]] = []
        self._count = 0

    def _add(self, batch: BatchFuture, first: int, count: int, positions) -> None:
        self._parts.append((batch, first, count, positions))
        self._count += count

    def _merge(self, other: "CallFuture") -> None:
        """Take ``other``'s parts, as the messages after this call's (``send_many``'s slices)."""
        base = self._count
        for batch, first, count, positions in other._parts:
            where = positions + base if isinstance(positions, int) else [p + base for p in positions]
            self._parts.append((batch, first, count, where))
        self._count += other._count

    def __len__(self) -> int:
        return self._count

    def done(self) -> bool:
        return all(batch._done for batch, _, _, _ in self._parts)

    def wait(self, timeout_s: float | None = None) -> None:
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for batch, _, _, _ in self._parts:
            batch.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def failures(self) -> dict[tuple[str, int], tuple[int, RaylogError]]:
        """``{(topic, partition): (messages lost, error)}`` of the resolved parts."""
        lost: dict[tuple[str, int], tuple[int, RaylogError]] = {}
        for batch, _, count, _ in self._parts:
            if batch._done and batch._error is not None:
                key = (batch.topic, batch.partition)
                n, err = lost.get(key, (0, batch._error))
                lost[key] = (n + count, err)
        return lost

    def exception(self, timeout_s: float | None = None):
        self.wait(timeout_s)
        failures = self.failures()
        return DeliveryError.of(failures, self._count) if failures else None

    def result(self, timeout_s: float | None = None) -> list[RecordMetadata]:
        error = self.exception(timeout_s)
        if error is not None:
            raise error
        out: list = [None] * self._count
        for batch, first, count, positions in self._parts:
            partition = batch.partition
            for k in range(count):
                where = positions + k if isinstance(positions, int) else positions[k]
                out[where] = RecordMetadata(partition, batch.offset_of(first + k))
        return out

    def add_done_callback(self, fn: Callable[["CallFuture"], None]) -> None:
        """Call ``fn(self)`` once every part is resolved."""
        parts = self._parts
        if not parts:
            fn(self)
            return
        remaining = [len(parts)]
        lock = threading.Lock()

        def one_done():
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                fn(self)

        for batch, _, _, _ in parts:
            batch.on_done(one_done)
