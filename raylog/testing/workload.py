"""The workload of a fault run: producers and a consumer group that record
everything they do (see :mod:`raylog.testing.history`).

* :class:`ProducerWorker`: a thread of the driver with a producer of its own
  (acks ``1`` or ``"all"``, keyed or keyless, optionally compressed,
  idempotence as configured by the producer's defaults), sending unique values
  (``"<name>-<n>"``) at a steady rate and recording each send's outcome.
* :class:`~raylog.testing.consumer_worker.ConsumerWorker` (its own module):
  a member of the consumer group in a Ray actor.

A message a flip-byte fault damaged is reported by the consumer as corrupt;
the fault also writes its position and the next message's offset to
``<history dir>/damaged.lines`` (JSON lines), and the consumer seeks past it (recorded as
a ``seek``), as an application that skips a known-bad message would.

Thread-safety: a :class:`ProducerWorker` is driven by its own thread
(``start``/``stop`` from one other thread).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time

from raylog import partition_for_key
from raylog.testing.history import FAILED, OK, UNKNOWN, Recorder

log = logging.getLogger(__name__)

DAMAGED_FILE = "damaged.lines"

#: errors that say a message was refused (certainly not stored)
_REFUSED = ("InvalidMessageError", "MessageTooLargeError", "ConfigError", "AuthenticationError",
            "CorruptMessageError", "FrameTooLargeError", "UnknownTopicError")


def _outcome_of(err: BaseException) -> str:
    return FAILED if any(cls.__name__ in _REFUSED for cls in type(err).__mro__) else UNKNOWN


def _future_result(fut):
    """(partition, offset) of a producer future, whatever its shape."""
    result = fut.result(0)
    partition, offset = (result[0], result[1]) if isinstance(result, tuple) else (result.partition, result.offset)
    # a negative offset: stored, but the producer does not know where (acks=0, or
    # a duplicate the partition recognised without its position)
    return int(partition), (int(offset) if offset is not None and offset >= 0 else None)


class ProducerWorker:
    """Sends unique values to ``topic`` at ``rate`` messages a second."""
    def __init__(
        self,
        client,
        topic: str,
        name: str,
        history_dir: str,
        *,
        acks,
        keyed: bool,
        compression: str | None = None,
        rate: float = 200.0,
        seed: int = 0,
        keys: int = 64,
        flush_every: int = 200,
    ):
        self.name = name
        self.topic = topic
        self.acks = acks
        self.keyed = keyed
        self.compression = compression
        self.rate = rate
        self.keys = keys
        self.flush_every = flush_every
        self._rng = random.Random(seed)
        self.recorder = Recorder(os.path.join(history_dir, f"{name}.jsonl"), name)
        try:
            self.producer = client.producer(acks=acks, compression=compression, linger_ms=5, batch_size=50)
        except Exception as err:  # noqa: BLE001 - a producer without acks="all"
            if acks != "all" or type(err).__name__ != "ConfigError":
                raise
            log.warning("%s: acks='all' is not supported here (%s); using acks=1 and recording that", name, err)
            self.acks = 1
            self.producer = client.producer(acks=1, compression=compression, linger_ms=5, batch_size=50)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fault-{name}", daemon=True)
        self._pending: list = []  # futures (or values, without futures) not resolved yet
        self._lock = threading.Lock()
        self._stopped = False
        self.sent = 0
        self.outcomes = {OK: 0, FAILED: 0, UNKNOWN: 0}

    def start(self) -> "ProducerWorker":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop sending, wait (at most about ``timeout_s`` in all) for the
        outcomes of what was sent; sends still without one are recorded as
        unknown."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._thread.join(timeout_s / 3)
        if self._thread.is_alive():
            log.warning("%s: the sending thread is still blocked in send() after %.0f s", self.name, timeout_s / 3)
        # A thread blocked in send() holds the lock: go on without it then (it
        # touches nothing of ours until send() returns, and it stops after that).
        locked = self._lock.acquire(timeout=max(1.0, deadline - time.monotonic()) / 3)
        try:
            self._stopped = True
            if self._uses_futures():
                try:
                    self.producer.flush(max(1.0, deadline - time.monotonic()))
                except Exception as err:  # noqa: BLE001 - each future says what became of its send
                    log.info("%s: final flush failed: %s", self.name, err)
                self._settle_futures(final=True, deadline=deadline)
            else:
                self._flush_and_settle()
        finally:
            if locked:
                self._lock.release()
        self.summary = {"name": self.name, "acks": str(self.acks), "keyed": self.keyed, "codec": self.compression,
                        "sent": self.sent, "outcomes": dict(self.outcomes),
                        "blocked_in_send": self._thread.is_alive()}
        if self._thread.is_alive():
            import sys
            import traceback

            frame = sys._current_frames().get(self._thread.ident)
            self.summary["blocked_at"] = traceback.format_stack(frame)[-6:] if frame is not None else None
        try:
            self.summary["stats"] = self.producer.stats()
        except Exception:  # noqa: BLE001
            pass
        try:
            self.producer.close(timeout_s=5)
        except Exception:  # noqa: BLE001
            pass
        self.recorder.close()

    # -- the loop --------------------------------------------------------------

    def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        n = 0
        while not self._stop.is_set():
            now = time.monotonic()
            if now < next_at:
                time.sleep(min(next_at - now, 0.05))
                continue
            burst = max(1, int((now - next_at) / interval) + 1)
            with self._lock:
                if self._stopped:
                    return
                for _ in range(min(burst, 100)):
                    self._send_one(n)
                    n += 1
                next_at += burst * interval
                if n % self.flush_every < burst and not self._uses_futures():
                    self._flush_and_settle()
                self._settle_futures()

    def _uses_futures(self) -> bool:
        return getattr(self, "_futures", None) is True

    def _send_one(self, n: int) -> None:
        value = f"{self.name}-{n}"
        key = f"k{self._rng.randrange(self.keys)}".encode() if self.keyed else None
        t0 = time.time()
        try:
            fut = self.producer.send(self.topic, value.encode(), key=key)
        except Exception as err:  # noqa: BLE001 - refused at once: not queued
            self._record(value, key, t0, FAILED, None, None, err)
            return
        self.sent += 1
        if fut is not None and hasattr(fut, "result"):
            self._futures = True
            self._pending.append((value, key, t0, fut))
        else:
            self._futures = False
            self._pending.append((value, key, t0, None))

    def _settle_futures(self, final: bool = False, deadline: float | None = None) -> None:
        """Record every resolved future (all of them when ``final``: those
        not resolved by ``deadline`` as unknown)."""
        if not self._uses_futures():
            return
        keep = []
        for value, key, t0, fut in self._pending:
            if not fut.done():
                if not final:
                    keep.append((value, key, t0, fut))
                    continue
                try:
                    fut.result(max(0.0, (deadline or 0) - time.monotonic()))
                except Exception:  # noqa: BLE001 - looked at below
                    pass
            if not fut.done():
                self._record(value, key, t0, UNKNOWN, None, None, TimeoutError("no outcome by the end of the run"))
                continue
            err = fut.exception(0)
            if err is None:
                partition, offset = _future_result(fut)
                self._record(value, key, t0, OK, partition, offset, None)
            else:
                self._record(value, key, t0, _outcome_of(err), None, None, err)
        self._pending = keep

    def _flush_and_settle(self) -> None:
        """Without futures: a flush that returns acknowledges everything sent
        before it (offsets unknown); one that raises leaves it unknown."""
        try:
            self.producer.flush(30)
        except Exception as err:  # noqa: BLE001
            self._settle_unflushed(err)
            return
        for value, key, t0, _ in self._pending:
            self._record(value, key, t0, OK, self._partition_of(key), None, None)
        self._pending = []

    def _settle_unflushed(self, err) -> None:
        if self._uses_futures():
            return
        for value, key, t0, _ in self._pending:
            self._record(value, key, t0, UNKNOWN, None, None, err)
        self._pending = []

    def _partition_of(self, key):
        if key is None:
            return None

        return partition_for_key(key, self.producer._partitions(self.topic))

    def _record(self, value, key, t0, outcome, partition, offset, err) -> None:
        self.outcomes[outcome] += 1
        self.recorder.record(
            "send", t0=t0, topic=self.topic, value=value, key=None if key is None else key.decode(),
            acks=str(self.acks), codec=self.compression, outcome=outcome,
            partition=partition if outcome == OK else None, offset=offset if outcome == OK else None,
            error=None if err is None else f"{type(err).__name__}: {err}"[:300],
        )
