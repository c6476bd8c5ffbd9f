"""The consumer side of a fault run's workload (see :mod:`raylog.testing.workload`).

:class:`ConsumerWorker`: a Ray actor (a process of its own) holding one
member of the consumer group, committing by hand after its polls or
automatically; it records every poll, commit, assignment, revocation and
seek in a history file of its own, so a member killed with SIGKILL leaves
its history behind. A killed member is restarted by Ray and records under a
new process name (slot and pid). A message a flip-byte fault damaged is
skipped by a recorded ``seek`` past it, at the position the fault wrote to
``<history dir>/damaged.lines``.

Thread-safety: a :class:`ConsumerWorker`'s methods may be called
concurrently (its loop runs on a thread of its own).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time

from raylog.client import Client
from raylog.retry import RetryPolicy
from raylog.testing.faults import drop_connection
from raylog.testing.faults import expire_session
from raylog.testing.history import OK, Recorder
from raylog.testing.workload import DAMAGED_FILE

log = logging.getLogger(__name__)

#: how long a member keeps trying to join (ZooKeeper away) before its start fails
JOIN_WAIT_S = 60.0


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

        self.slot = slot
        self.topic = topic
        self.history_dir = history_dir
        self.commit_mode = commit
        self.process = f"{slot}.{os.getpid()}"
        self.recorder = Recorder(os.path.join(history_dir, f"{self.process}.jsonl"), self.process)
        self.recorder.record("start")
        self._rng = random.Random(f"{seed}-{self.process}")
        self.client = self.consumer = None  # callbacks may run before the constructor returns
        # A member Ray starts again while ZooKeeper is away (a kill-consumer fault beside a
        # zookeeper-outage) joins once it is back: a constructor that raised would end the
        # actor for good, and the group would lose a member for the rest of the run.
        RetryPolicy.until(JOIN_WAIT_S, max_delay_s=2.0).call(
            self._join, zookeeper, cluster, token, group, session_timeout_ms,
            retry_if=lambda err: True, on_retry=lambda err: log.info("%s: joining again: %s", self.process, err),
        )
        self.polls = self.reads = self.errors = self.commits = 0
        self.last_error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-consumer", daemon=True)
        self._thread.start()

    def _join(self, zookeeper: str, cluster: str, token, group: str, session_timeout_ms: int) -> None:
        client = Client(zookeeper=zookeeper, cluster=cluster, token=token)
        try:
            self.consumer = client.consumer(
                [self.topic],
                group=group,
                auto_offset_reset="earliest",
                enable_auto_commit=self.commit_mode == "auto",
                auto_commit_interval_ms=1000,
                session_timeout_ms=session_timeout_ms,
                fetch_max_wait_ms=200,
                on_assigned=self._on_assigned,
                on_revoked=self._on_revoked,
            )
        except BaseException:
            client.close()
            raise
        self.client = client

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

        expire_session(self._group_zk(), timeout_s=30)

    def drop_connection(self) -> None:

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
    import ray  # heavy (Ray): imported when used

    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=4)(ConsumerWorker)
