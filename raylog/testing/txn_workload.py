"""The transactional workload of a fault run (``--workload txn``;
docs/design.md §6's transactions guarantee, checked by
:mod:`raylog.testing.txn_checker`), after Jepsen's Kafka workload.

* :class:`TxnWriter`: a thread of the driver with a transactional producer
  of its own (transactional id ``"<name>"``) running transactions one after
  the other: 1-4 sends, each to a random partition of the topic, of unique
  values ``"<name>-t<n>-<i>"`` (writer, transaction number, position); about
  :data:`OFFSETS_SHARE` of them also commit, for the writer's own input
  group (:func:`input_group`), an offset of :data:`INPUT_TOPIC`'s one
  partition (``n + 1``: growing per writer, so an offset names its
  transaction); about :data:`ABORT_SHARE`
  are aborted on purpose. It records a ``txn`` operation ``phase="begin"``
  when a transaction opens, then, once it ended, one ``send`` per send
  (``txn``, ``value``, ``partition``, ``offset`` when acknowledged,
  ``outcome``) and a ``txn`` operation ``phase="end"`` with its
  ``intent`` (``"commit"``/``"abort"``), its ``outcome``
  (:data:`COMMITTED`: the commit acknowledged; :data:`ABORTED`: the abort
  acknowledged, or the commit refused because the coordinator aborted
  the transaction at its timeout; :data:`NOT_COMMITTED`: no commit was ever asked for, as
  when the producer was dropped mid-transaction, so it cannot be
  committed; :data:`UNKNOWN`: a commit asked for without a definite
  answer), ``values``, ``offsets`` (``{group: offset}``) and ``error``. When its producer
  errors (fenced, a timeout, the coordinator away) it makes a new producer
  of the same transactional id, which fences the old one, as an
  application would.
* :meth:`TxnWriter.kill` (the ``kill-producer`` fault): at the writer's
  next transaction, once its first send is stored, the producer is dropped
  without an abort (its sender stopped, its state gone); the next producer
  of the id comes after the transaction's timeout (the coordinator aborts
  the open transaction by its timeout first) or, with ``wait_timeout``
  false, at once (it fences the old epoch: the coordinator aborts the open
  transaction then). The dropped producer, a zombie now, then asks the
  coordinator to commit its transaction: the transaction's ``end``
  operation records ``zombie_commit`` (``"refused"``, as it must be,
  ``"accepted"``, or None: unanswered).
* :class:`TxnReader`: a consumer of every partition from the start, of
  one isolation level (``read_committed`` or ``read_uncommitted``), polling
  the whole run and recording each poll (``reads``: ``[[topic, partition,
  offset, value], ...]`` in the order received); a consumer it had to make
  again starts where the last one was, recorded as a ``seek``.
* :class:`OffsetsWatch`: the input groups' committed offsets, read every
  few seconds (an ``offsets`` operation: ``{group: offset}``).
* :func:`final_read`: after the writers stopped and the faults healed, a
  read_committed consumer reads every partition to its last stable offset
  (a ``final`` operation per partition: ``hw``, ``lso``, ``reads``,
  ``complete``), waiting for the last stable offset to reach the high
  watermark (an open transaction ends by its timeout at the latest); then
  the coordinator's record of every writer's transactional id (a
  ``final`` operation ``what="txn-state"``) and the input groups' offsets
  (``what="offsets"``).

Thread-safety: writers, readers and the watch are each driven by their own
thread; ``start``/``stop``/``kill`` from other threads.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time

from raylog.testing.history import FAILED, OK, UNKNOWN, Recorder

log = logging.getLogger(__name__)

TOPIC = "txn"
#: the topic whose offsets the writers commit with their transactions (one partition, a group per writer)
INPUT_TOPIC = "txn-input"
#: share of the transactions aborted on purpose
ABORT_SHARE = 0.2
#: share of the transactions that also commit the input group's offset
OFFSETS_SHARE = 0.3
#: the writers' transaction timeout: short, so that a dropped producer's
#: transaction is aborted within the run
TRANSACTION_TIMEOUT_MS = 6000
TOPIC_SETTINGS = dict(flush_ms=20)

COMMITTED, ABORTED, NOT_COMMITTED = "committed", "aborted", "not-committed"
TXN_OUTCOMES = (COMMITTED, ABORTED, NOT_COMMITTED, UNKNOWN)


def _error_text(err: BaseException | None) -> str | None:
    return None if err is None else f"{type(err).__name__}: {err}"[:300]


def _future_offset(fut):
    """``(outcome, partition, offset)`` of a resolved send future."""
    if not fut.done():
        return UNKNOWN, None, None
    err = fut.exception(0)
    if err is not None:
        return FAILED, None, None
    result = fut.result(0)
    partition, offset = (result[0], result[1]) if isinstance(result, tuple) else (result.partition, result.offset)
    return OK, int(partition), (int(offset) if offset is not None and offset >= 0 else None)


def _drop(producer) -> None:
    """Drop a producer as a killed process would: no abort, no end of its
    transaction; its sender stopped (``close_at_exit``: what it had sent is
    delivered first, within its delivery deadline, the rest abandoned)."""
    producer.close_at_exit()


class TxnWriter:
    """Runs transactions on ``topic`` at most ``rate`` a second (see the module docstring)."""

    def __init__(self, client, topic: str, name: str, index: int, history_dir: str, *, partitions: int,
                 rate: float, seed: int, abort_share: float = ABORT_SHARE, offsets_share: float = OFFSETS_SHARE,
                 timeout_ms: int = TRANSACTION_TIMEOUT_MS):
        self.client = client
        self.topic = topic
        self.name = name
        self.index = index
        self.partitions = partitions
        self.rate = rate
        self.abort_share = abort_share
        self.offsets_share = offsets_share
        self.timeout_ms = timeout_ms
        self._rng = random.Random(seed)
        self.recorder = Recorder(os.path.join(history_dir, f"{name}.jsonl"), name)
        self._stop = threading.Event()
        self._kill = threading.Event()
        self._killed = threading.Event()
        self.kills = 0
        self.kill_detail: dict = {}
        self._successor_after_s = 0.0
        self.producer = None
        self.producers_made = 0
        self.sent = 0
        self.outcomes = {o: 0 for o in TXN_OUTCOMES}
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"fault-{name}", daemon=True)

    def start(self) -> "TxnWriter":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        if self.producer is not None:
            try:
                self.producer.close(timeout_s=5)
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self.recorder.close()
        self.summary = {"name": self.name, "transactions": sum(self.outcomes.values()), "outcomes": dict(self.outcomes),
                        "sends": self.sent, "producers_made": self.producers_made, "kills": self.kills,
                        "errors": self.errors[:10], "blocked": self._thread.is_alive()}

    def kill(self, wait_timeout: bool = True, timeout_s: float = 60.0) -> dict:
        """Drop the producer in the middle of the next transaction (see the
        module docstring); returns what was dropped once it was."""
        self._successor_after_s = (self.timeout_ms / 1000.0 + 2.0) if wait_timeout else 0.0
        self._killed.clear()
        self._kill.set()
        if not self._killed.wait(timeout_s):
            self._kill.clear()
            from raylog.testing.faults import FaultInjectionError

            raise FaultInjectionError(f"{self.name} did not reach a transaction to drop within {timeout_s:g} s")
        return dict(self.kill_detail)

    # -- the loop --------------------------------------------------------------

    def _new_producer(self):
        """A producer of the id (fencing the older one), tried until one is made or the writer stops."""
        while not self._stop.is_set():
            try:
                producer = self.client.producer(transactional_id=self.name, transaction_timeout_ms=self.timeout_ms,
                                                linger_ms=2)
                self.producers_made += 1
                return producer
            except Exception as err:  # noqa: BLE001 - the coordinator away: again
                self.errors.append(f"new producer: {_error_text(err)}")
                self._stop.wait(0.5)
        return None

    def _replace_producer(self) -> None:
        old, self.producer = self.producer, None
        if old is not None:
            try:
                old.close(timeout_s=2)
            except Exception:  # noqa: BLE001 - it is left behind anyway
                pass
        self.producer = self._new_producer()

    def _run(self) -> None:
        self.producer = self._new_producer()
        interval = 1.0 / self.rate
        n = 0
        while not self._stop.is_set() and self.producer is not None:
            started = time.monotonic()
            try:
                self._transaction(n)
            except Exception as err:  # noqa: BLE001 - recorded by the transaction; never ends the writer
                log.warning("%s: transaction %d: %s", self.name, n, _error_text(err))
            n += 1
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def _transaction(self, n: int) -> None:
        txn = f"{self.name}-t{n}"
        rng = self._rng
        intent = "abort" if rng.random() < self.abort_share else "commit"
        parts = [rng.randrange(self.partitions) for _ in range(rng.randint(1, 4))]
        offsets = {input_group(self.name): n + 1} if rng.random() < self.offsets_share else None
        killing = self._kill.is_set()
        t0 = time.time()
        self.recorder.record("txn", t0=t0, phase="begin", txn=txn, intent=intent, partitions=parts, offsets=offsets,
                             kill=killing)
        producer = self.producer
        sends: list = []  # (value, partition, t0, future or None, error)
        outcome = error = None
        asked_commit = False
        try:
            producer.begin_transaction()
            for i, p in enumerate(parts):
                value = f"{txn}-{i}"
                ts = time.time()
                try:
                    fut = producer.send(self.topic, value.encode(), partition=p)
                except Exception as err:  # noqa: BLE001 - refused at once
                    sends.append((value, p, ts, None, err))
                    raise
                sends.append((value, p, ts, fut, None))
                self.sent += 1
                if killing:
                    fut.exception(30)  # stored in the partition: the transaction is open there
                    break
            if killing:
                outcome = NOT_COMMITTED
            else:
                if offsets is not None:
                    producer.send_offsets_to_transaction({(INPUT_TOPIC, 0): n + 1}, input_group(self.name))
                if intent == "commit":
                    asked_commit = True
                    producer.commit_transaction(timeout_s=30)
                    outcome = COMMITTED
                else:
                    producer.abort_transaction(timeout_s=30)
                    outcome = ABORTED
        except Exception as err:  # noqa: BLE001 - the outcome says what it means
            error = err
        zombie = None
        if killing:
            zombie = self._drop_now(txn, sends, error)
            outcome = NOT_COMMITTED
        elif outcome is None and asked_commit and type(error).__name__ == "InvalidProducerEpochError":
            # the coordinator answered that it aborted the transaction at its timeout: a definite abort
            outcome = ABORTED
            self._replace_producer()
        elif outcome is None:
            # a commit asked for and not answered may have happened; anything else did not
            outcome = self._abort_after(producer, UNKNOWN if asked_commit else NOT_COMMITTED)
        for value, p, ts, fut, err in sends:
            if fut is None:
                self._send_op(txn, value, ts, FAILED, None, None, err)
                continue
            state, partition, offset = _future_offset(fut)
            if state == FAILED and outcome != COMMITTED:
                state = UNKNOWN  # a transactional batch may be stored although its future failed
            self._send_op(txn, value, ts, state, partition, offset, fut.exception(0) if fut.done() else None)
        self.outcomes[outcome] += 1
        self.recorder.record("txn", t0=t0, phase="end", txn=txn, intent=intent, outcome=outcome,
                             values=[s[0] for s in sends], offsets=offsets, error=_error_text(error),
                             **({"killed": True, "zombie_commit": zombie} if killing else {}))

    def _abort_after(self, producer, otherwise: str) -> str:
        """After an error: abort the transaction (ABORTED when the abort is
        acknowledged, else ``otherwise``); a producer that cannot go on is
        replaced (a new one of the id fences it and aborts what it left)."""
        try:
            producer.abort_transaction(timeout_s=30)
            aborted = True
        except Exception as err:  # noqa: BLE001 - fenced, expired, the coordinator away
            self.errors.append(f"abort: {_error_text(err)}")
            aborted = False
        if not aborted:
            self._replace_producer()
        return ABORTED if aborted else otherwise

    def _drop_now(self, txn: str, sends: list, error) -> str | None:
        """The kill-producer fault: drop the producer mid-transaction; its
        successor now or after the timeout. Then the dropped one, a zombie,
        asks the coordinator to commit its transaction: returns
        ``"refused"`` (fenced, or its epoch expired: as it must be),
        ``"accepted"``, or None when the question went unanswered."""
        self.kills += 1
        wait_s = self._successor_after_s
        old, self.producer = self.producer, None
        _drop(old)
        self._kill.clear()
        if wait_s:
            self._stop.wait(wait_s)
        self.producer = self._new_producer()
        zombie = None
        if self.producer is not None and old.transaction is not None:
            from raylog.errors import InvalidProducerEpochError, InvalidTxnStateError, ProducerFencedError

            try:
                old.transaction.end(True)  # the coordinator's call alone: the old sender is gone
                zombie = "accepted"
            except (ProducerFencedError, InvalidProducerEpochError, InvalidTxnStateError):
                zombie = "refused"
            except Exception as err:  # noqa: BLE001 - the coordinator away: no answer
                self.errors.append(f"zombie commit: {_error_text(err)}")
        self.kill_detail = {"writer": self.name, "txn": txn, "values": [s[0] for s in sends],
                            "successor_after_s": wait_s, "zombie_commit": zombie, "error": _error_text(error)}
        self._killed.set()
        return zombie

    def _send_op(self, txn, value, t0, outcome, partition, offset, err) -> None:
        self.recorder.record("send", t0=t0, topic=self.topic, txn=txn, value=value, key=None, acks="all",
                             codec=None, outcome=outcome, partition=partition if outcome == OK else None,
                             offset=offset if outcome == OK else None, error=_error_text(err))


class TxnReader:
    """Polls every partition of ``topic`` from the start with one isolation
    level, recording every poll."""

    def __init__(self, client, topic: str, partitions: int, history_dir: str, isolation: str):
        self.client = client
        self.topic = topic
        self.partitions = partitions
        self.isolation = isolation
        self.name = f"reader-{isolation.replace('_', '-')}"
        self.recorder = Recorder(os.path.join(history_dir, f"{self.name}.jsonl"), self.name)
        self.reads = 0
        self.consumers_made = 0
        self._positions: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fault-{self.name}", daemon=True)

    def start(self) -> "TxnReader":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.recorder.close()
        self.summary = {"name": self.name, "reads": self.reads, "consumers_made": self.consumers_made}

    def _consumer(self):
        consumer = self.client.consumer(self.topic, isolation_level=self.isolation, auto_offset_reset="earliest")
        consumer.assign([(self.topic, p) for p in range(self.partitions)])
        for p, position in sorted(self._positions.items()):
            consumer.seek(self.topic, p, position)
            self.recorder.record("seek", topic=self.topic, partition=p, offset=position, reason="new consumer")
        self.consumers_made += 1
        return consumer

    def _run(self) -> None:
        self.recorder.record("start", isolation=self.isolation)
        consumer = None
        failures = 0
        while not self._stop.is_set():
            try:
                if consumer is None:
                    consumer = self._consumer()
                t0 = time.time()
                messages = consumer.poll(timeout_ms=300)
                failures = 0
            except Exception as err:  # noqa: BLE001 - recorded; a consumer failing on and on is made again
                self.recorder.record("poll", reads=[], error=_error_text(err))
                failures += 1
                if failures >= 5 and consumer is not None:
                    try:
                        consumer.close()
                    except Exception:  # noqa: BLE001
                        pass
                    consumer = None
                self._stop.wait(0.3)
                continue
            if messages:
                self.recorder.record("poll", t0=t0, reads=[[m.topic, m.partition, m.offset, m.value.decode(
                    errors="replace")] for m in messages], error=None)
                self.reads += len(messages)
                for m in messages:
                    self._positions[m.partition] = m.next_offset
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001
                pass
        self.recorder.record("stop")


class OffsetsWatch:
    """Reads the writers' input groups' committed offsets every ``interval_s``."""

    def __init__(self, client, history_dir: str, writers: list[str], interval_s: float = 2.0):
        self.client = client
        self.writers = list(writers)
        self.interval_s = interval_s
        self.recorder = Recorder(os.path.join(history_dir, "offsets-watch.jsonl"), "offsets-watch")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-offsets-watch", daemon=True)

    def start(self) -> "OffsetsWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.recorder.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            t0 = time.time()
            try:
                offsets = group_offsets(self.client, self.writers)
            except Exception as err:  # noqa: BLE001 - ZooKeeper away: next time
                log.debug("offsets watch: %s", err)
                continue
            self.recorder.record("offsets", t0=t0, offsets=offsets)


def input_group(writer: str) -> str:
    """The input group whose offsets ``writer`` commits with its transactions."""
    return f"{INPUT_TOPIC}-{writer}"


def group_offsets(client, writers: list[str]) -> dict[str, int]:
    """``{group: committed offset of INPUT_TOPIC/0}`` of the writers' input groups that have one."""
    out = {}
    for writer in writers:
        group = input_group(writer)
        for row in client.describe_group(group, timeout_s=5.0):
            if (row.get("topic"), row.get("partition")) == (INPUT_TOPIC, 0) and row.get("committed") is not None:
                out[group] = row["committed"]
    return out


def final_read(client, topic: str, partitions: int, history_dir: str, writers: list[str], *,
               stable_wait_s: float = 30.0, timeout_s: float = 60.0) -> dict:
    """The final read (see the module docstring); returns its summary."""
    recorder = Recorder(os.path.join(history_dir, "final-reader.jsonl"), "final-reader")
    summary: dict = {"partitions": [], "complete": True}
    try:
        consumer = client.consumer(topic, isolation_level="read_committed", auto_offset_reset="earliest")
        try:
            deadline = time.monotonic() + stable_wait_s
            ends: dict[int, tuple[int, int]] = {}
            while True:  # the last stable offsets reach the high watermarks (open transactions end)
                for p in range(partitions):
                    try:
                        hw = client.offsets(topic, p)[1]
                        lso = consumer.offsets((topic, p))[1]
                        ends[p] = (hw, lso)
                    except Exception as err:  # noqa: BLE001 - a partition still away: asked again
                        log.info("final read: ends of %s/%d: %s", topic, p, err)
                if len(ends) == partitions and all(lso >= hw for hw, lso in ends.values()):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            consumer.assign([(topic, p) for p in range(partitions)])
            reads: dict[int, list] = {p: [] for p in range(partitions)}
            t0 = time.time()
            until = time.monotonic() + timeout_s
            goal = {p: ends.get(p, (None, None))[1] for p in range(partitions)}
            while time.monotonic() < until:
                for m in consumer.poll(timeout_ms=300):
                    reads[m.partition].append([m.offset, m.value.decode(errors="replace")])
                if all(goal[p] is not None and (consumer.position(topic, p) or 0) >= goal[p]
                       for p in range(partitions)):
                    break
            for p in range(partitions):
                hw, lso = ends.get(p, (None, None))
                position = consumer.position(topic, p)
                complete = lso is not None and position is not None and position >= lso
                summary["complete"] &= complete
                recorder.record("final", t0=t0, what="read", topic=topic, partition=p, hw=hw, lso=lso,
                                position=position, reads=reads[p], complete=complete)
                summary["partitions"].append({"partition": p, "hw": hw, "lso": lso, "reads": len(reads[p]),
                                              "complete": complete})
        finally:
            consumer.close()
        coordinator = client.transaction_coordinator()
        import ray  # heavy (Ray): imported when used

        for name in writers:
            try:
                state = ray.get(coordinator.describe.remote(name), timeout=30)
            except Exception as err:  # noqa: BLE001 - recorded as unknown
                state = {"error": _error_text(err)}
            recorder.record("final", what="txn-state", transactional_id=name,
                            state=None if state is None else state.get("state"), error=(state or {}).get("error"))
        try:
            recorder.record("final", what="offsets", offsets=group_offsets(client, writers))
        except Exception as err:  # noqa: BLE001
            recorder.record("final", what="offsets", offsets=None, error=_error_text(err))
    finally:
        recorder.close()
    return summary
