"""The history of a fault run: every operation with its invocation and completion.

A history is a list of **operations**, plain dicts that serialise to one JSON
line each (the recorder writes them as they happen, so a process killed with
SIGKILL leaves every operation it completed on disk). Every operation has

``process``
    who did it: ``"producer-0"``, ``"consumer-1.4711"`` (a consumer slot and
    the pid of its incarnation), ``"nemesis"``;
``seq``
    its position in that process's own order (0, 1, 2 ...);
``type``
    one of the kinds below;
``t0``, ``t1``
    wall-clock seconds (``time.time()``) of invocation and completion (one
    machine: the clocks of all processes agree).

The kinds and their fields:

``send``
    one message: ``topic``, ``value`` (unique in the run), ``key`` (or None),
    ``acks`` (``"1"`` or ``"all"``), ``codec`` (None or the compression),
    ``outcome`` (``"ok"``: stored at ``partition``/``offset``; ``"failed"``:
    the producer says it was not stored; ``"unknown"``: no answer, may or may
    not be stored), ``partition`` and ``offset`` (None when unknown), ``error``.
``poll``
    what one ``poll()`` handed to the application: ``reads``, a list of
    ``[topic, partition, offset, value]`` in the order received; ``error``.
``commit``
    ``offsets`` ``{"topic/partition": offset}``, ``mode`` (``"manual"`` or
    ``"auto"``), ``outcome``.
``assign`` / ``revoke``
    ``partitions``: ``[[topic, partition], ...]`` given to or taken from the
    consumer (a new stream of reads starts on each).
``seek``
    ``topic``, ``partition``, ``offset``, ``reason`` (a new stream starts).
``fault``
    ``kind``, ``target``, ``detail``; a ``flip-byte`` fault also names the
    message it damaged: ``detail["topic"]``, ``["partition"]``, ``["offset"]``.
``start`` / ``stop``
    a consumer process began or ended its loop (``stop`` only when it ended
    cleanly).
``scan``
    the compaction workload's read of one partition from its log start
    (:mod:`raylog.testing.compaction_workload`): ``topic``, ``partition``,
    ``start``, ``end`` (the position reached), ``hw``, ``reads``
    ``[[offset, key, value], ...]``, ``final``, ``complete``, ``error``. Its
    ``send`` operations carry ``id`` and ``delete`` too (``value`` None for
    a delete).
``txn`` / ``offsets`` / ``final``
    the transactional workload's (:mod:`raylog.testing.txn_workload`): a
    transaction's ``begin`` and ``end`` (``txn``, ``intent``, ``outcome``,
    ``values``, ``offsets``), the input groups' committed ``offsets``, and
    the final read of each partition (``what="read"``: ``hw``, ``lso``,
    ``reads`` ``[[offset, value], ...]``, ``complete``), of each
    transactional id's coordinator state (``what="txn-state"``) and of the
    group's offsets (``what="offsets"``). Its ``send`` operations carry
    ``txn`` too.

Thread-safety: :class:`Recorder` may be shared by the threads of one process.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Iterable, Iterator

OK, FAILED, UNKNOWN = "ok", "failed", "unknown"
OUTCOMES = (OK, FAILED, UNKNOWN)
KINDS = ("send", "poll", "commit", "assign", "revoke", "seek", "fault", "start", "stop", "scan", "txn", "offsets",
         "final")



def _new_op(recorder, type: str, t0: float | None, t1: float | None, fields: dict) -> dict:
    """The next operation of a recorder (its lock held): ``t1`` defaults to
    now, ``t0`` to ``t1``."""
    if t1 is None:
        t1 = time.time()
    op = {"process": recorder.process, "seq": recorder._seq, "type": type, "t0": t1 if t0 is None else t0, "t1": t1}
    op.update(fields)
    recorder._seq += 1
    return op

class Recorder:
    """Appends one process's operations to a JSON-lines file (and keeps none
    in memory). Each line is written with one ``os.write`` on a file opened
    ``O_APPEND``, so what was recorded survives the process being killed."""

    def __init__(self, path: str, process: str):
        self.path = path
        self.process = process
        self._seq = 0
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def record(self, type: str, t0: float | None = None, t1: float | None = None, **fields) -> dict:
        """Write one operation now; ``t1`` defaults to now, ``t0`` to ``t1``."""
        if type not in KINDS:
            raise ValueError(f"unknown operation type {type!r}; one of {KINDS}")
        with self._lock:
            op = _new_op(self, type, t0, t1, fields)
            os.write(self._fd, (json.dumps(op, separators=(",", ":")) + "\n").encode())
        return op

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class MemoryRecorder:
    """The same interface, keeping operations in a list (one process, tests)."""

    def __init__(self, process: str, ops: list | None = None):
        self.process = process
        self.ops = [] if ops is None else ops
        self._seq = 0
        self._lock = threading.Lock()

    def record(self, type: str, t0: float | None = None, t1: float | None = None, **fields) -> dict:
        with self._lock:
            op = _new_op(self, type, t0, t1, fields)
            self.ops.append(op)
        return op

    def close(self) -> None:
        pass


def read_history(paths: Iterable[str]) -> list[dict]:
    """Every operation of the given JSON-lines files. A last line cut short by
    a kill is skipped (it was never completely recorded)."""
    ops = []
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break
                ops.append(json.loads(line))
    return ops


def history_files(directory: str) -> list[str]:
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".jsonl"))


def by_process(ops: Iterable[dict]) -> dict[str, list[dict]]:
    """Operations grouped by process, each group in the process's own order."""
    out: dict[str, list[dict]] = {}
    for op in ops:
        out.setdefault(op["process"], []).append(op)
    for group in out.values():
        group.sort(key=lambda op: op["seq"])
    return out


def tp_key(topic: str, partition: int) -> str:
    """``"topic/partition"``: how operations name a topic-partition in JSON keys."""
    return f"{topic}/{partition}"


def iter_reads(ops: Iterable[dict]) -> Iterator[tuple[dict, str, int, int, str]]:
    for op in ops:
        if op["type"] == "poll":
            for topic, partition, offset, value in op.get("reads") or ():
                yield op, topic, partition, offset, value
