"""The workload of a fault run: producers and a consumer group that record
everything they do (see :mod:`raylog.testing.history`).

* :class:`ProducerWorker`: a thread of the driver with a producer of its own
  (acks ``1`` or ``"all"``, keyed or keyless, optionally compressed,
  idempotence as configured by the producer's defaults), sending unique values
  (``"<name>-<n>"``) at a steady rate and recording each send's outcome.
* :class:`ConsumerWorker`: a Ray actor (a process of its own) holding one
  member of the consumer group, committing by hand after its polls or
  automatically; it records every poll, commit, assignment, revocation and
  seek in a history file of its own, so a member killed with SIGKILL leaves
  its history behind. A killed member is restarted by Ray and records under
  a new process name (slot and pid).

A message a flip-byte fault damaged is reported by the consumer as corrupt;
the fault also writes its position and the next message's offset to
``<history dir>/damaged.lines`` (JSON lines), and the consumer seeks past it (recorded as
a ``seek``), as an application that skips a known-bad message would.

Thread-safety: a :class:`ProducerWorker` is driven by its own thread
(``start``/``stop`` from one other thread); a :class:`ConsumerWorker`'s
methods may be called concurrently (its loop runs on a thread of its own).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time

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
        from raylog.producer.partitioner import partition_for_key

        return partition_for_key(key, self.producer._partitions(self.topic))

    def _record(self, value, key, t0, outcome, partition, offset, err) -> None:
        self.outcomes[outcome] += 1
        self.recorder.record(
            "send", t0=t0, topic=self.topic, value=value, key=None if key is None else key.decode(),
            acks=str(self.acks), codec=self.compression, outcome=outcome,
            partition=partition if outcome == OK else None, offset=offset if outcome == OK else None,
            error=None if err is None else f"{type(err).__name__}: {err}"[:300],
        )


class ConsumerWorker:
    """The body of a consumer-group member actor (wrapped by :func:`consumer_actor_class`)."""

    def __init__(
        self,
        zookeeper: str,
        cluster: str,
        token,
        topic: str,
        group: str,
        slot: str,
        history_dir: str,
        commit: str = "manual",
        session_timeout_ms: int = 6000,
        seed: int = 0,
    ):
        from raylog.client import Client

        self.slot = slot
        self.topic = topic
        self.history_dir = history_dir
        self.commit_mode = commit
        self.process = f"{slot}.{os.getpid()}"
        self.recorder = Recorder(os.path.join(history_dir, f"{self.process}.jsonl"), self.process)
        self.recorder.record("start")
        self._rng = random.Random(f"{seed}-{self.process}")
        self.client = Client(zookeeper=zookeeper, cluster=cluster, token=token)
        self.consumer = None  # callbacks may run before the constructor returns
        self.consumer = self.client.consumer(
            [topic],
            group=group,
            auto_offset_reset="earliest",
            enable_auto_commit=commit == "auto",
            auto_commit_interval_ms=1000,
            session_timeout_ms=session_timeout_ms,
            fetch_max_wait_ms=200,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
        )
        self.polls = self.reads = self.errors = self.commits = 0
        self.last_error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-consumer", daemon=True)
        self._thread.start()

    # -- callbacks -------------------------------------------------------------

    def _on_assigned(self, partitions) -> None:
        self.recorder.record("assign", partitions=sorted([t, p] for t, p in partitions))

    def _on_revoked(self, partitions) -> None:
        self.recorder.record("revoke", partitions=sorted([t, p] for t, p in partitions))
        if self.commit_mode == "manual":
            self._commit()

    # -- the loop --------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.time()
            max_messages = self._rng.choice((1, 7, 100, 1000))
            try:
                messages = self.consumer.poll(timeout_ms=300, max_messages=max_messages)
            except Exception as err:  # noqa: BLE001 - recorded; the loop goes on
                self.errors += 1
                self.last_error = f"{type(err).__name__}: {err}"[:300]
                self.recorder.record("poll", t0=t0, reads=[], error=self.last_error)
                if not self._skip_damaged(err):
                    self._stop.wait(0.2)
                continue
            self.polls += 1
            if messages:
                self.reads += len(messages)
                self.recorder.record(
                    "poll", t0=t0,
                    reads=[[m.topic, m.partition, m.offset, m.value.decode(errors="replace")] for m in messages], error=None,
                )
                if self.commit_mode == "manual" and self._rng.random() < 0.3:
                    self._commit()

    def _commit(self) -> None:
        if self.consumer is None:
            return
        t0 = time.time()
        owned = self.consumer.assignment()
        offsets = {f"{t}/{p}": self.consumer.position(t, p) for t, p in sorted(owned)}
        try:
            self.consumer.commit()
        except Exception as err:  # noqa: BLE001
            self.recorder.record("commit", t0=t0, offsets=offsets, mode="manual", outcome="failed",
                                 error=f"{type(err).__name__}: {err}"[:300])
            return
        self.commits += 1
        self.recorder.record("commit", t0=t0, offsets=offsets, mode="manual", outcome=OK)

    def _skip_damaged(self, err) -> bool:
        """Seek past a message a flip-byte fault damaged (see the module doc)."""
        offset = getattr(err, "offset", None)
        if offset is None:
            return False
        path = os.path.join(self.history_dir, DAMAGED_FILE)
        try:
            with open(path) as f:
                damaged = [json.loads(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return False
        owned = self.consumer.assignment()
        for entry in damaged:
            tp = (entry["topic"], entry["partition"])
            if entry["offset"] == offset and tp in owned and getattr(err, "partition", tp[1]) == tp[1]:
                try:
                    self.consumer.seek(tp[0], tp[1], entry["next"])
                except Exception as seek_err:  # noqa: BLE001 - revoked meanwhile
                    log.info("could not seek past %s: %s", entry, seek_err)
                    return False
                self.recorder.record("seek", topic=tp[0], partition=tp[1], offset=entry["next"],
                                     reason=f"past the damaged message at {offset}")
                return True
        return False

    # -- control -------------------------------------------------------------------

    def pid(self) -> int:
        return os.getpid()

    def status(self) -> dict:
        owned = self.consumer.assignment()
        return {
            "process": self.process,
            "polls": self.polls,
            "reads": self.reads,
            "errors": self.errors,
            "commits": self.commits,
            "last_error": self.last_error,
            "positions": {f"{t}/{p}": self.consumer.position(t, p) for t, p in sorted(owned)},
        }

    def _group_zk(self):
        zk = getattr(self.consumer, "_group_zk", None)
        if zk is None:
            member = getattr(self.consumer, "_member", None)
            zk = getattr(member, "zk", None) or getattr(member, "_zk", None)
        if zk is None:
            raise RuntimeError("this consumer keeps no ZooKeeper session of its own")
        return zk

    def expire_session(self) -> None:
        from raylog.testing.faults import expire_session

        expire_session(self._group_zk(), timeout_s=30)

    def drop_connection(self) -> None:
        from raylog.testing.faults import drop_connection

        drop_connection(self._group_zk(), timeout_s=30)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(30)
        status = self.status()
        try:
            self.consumer.close()
        finally:
            self.client.close()
            self.recorder.record("stop")
            self.recorder.close()
        return status


def consumer_actor_class():
    import ray

    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=4)(ConsumerWorker)
