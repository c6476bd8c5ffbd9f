"""The checker of the transactional workload: docs/design.md §6's
transactions guarantee, read off a history
(:mod:`raylog.testing.txn_workload`), with the anomalies of Jepsen's Kafka
workload (its analyses of Redpanda 21.10.1 and Bufstream 0.1.0).

A transaction's **effective outcome**: committed when its commit was
acknowledged; aborted when its abort was acknowledged or no commit was ever
asked for (a producer dropped mid-transaction, an error before the
commit); a commit asked for without a definite answer (``unknown``) counts
as committed when the final read_committed read holds any of its values,
else as aborted (Jepsen's reading of an indeterminate write). Offsets are
raylog's (byte positions): the checker only compares them, never adds to
them.

A **stream** is what one reader read of one partition between two seeks
(a reader's consumer made again starts a new stream at a ``seek``); the
final read is one stream per partition. It *covers* the offsets from its
first read (or its seek) to its last read.

Anomalies (each forbidden):

``lost-write``
    a value of an effectively committed transaction absent from the final
    read_committed read of its partition (that read complete).
``duplicate``
    a value read at two offsets, or acknowledged at one offset and read at
    another.
``inconsistent-offset``
    one offset of a partition read with two values.
``aborted-read`` (G1a)
    a value of an effectively aborted transaction, or one no transaction
    wrote, handed to a read_committed reader (during the run or in the
    final read).
``intermediate-read`` (G1b)
    a read_committed stream that read some of a committed transaction's
    writes to a partition, and covered the offset of another of its writes
    to that partition without reading it: a part of the transaction seen.
``write-cycle`` (G0 against real time)
    T1 -> T2 when T1's write precedes T2's in a partition (by offset, in
    the final read), and T2 -> T1 in real time when T2's commit was
    acknowledged before T1 began: the two-edge cycle, a write stored below
    the writes of a transaction that had committed before its own began.
    (Longer cycles of the write graph, G0 between transactions that
    overlapped in time, are Kafka's semantics: KIP-98 does not isolate
    concurrent transactions' writes from each other, as Jepsen's Redpanda
    analysis discusses, and a concurrent third transaction can close a
    cycle through a real-time edge too; Tarjan's strongly connected
    components of the write graph are counted in
    ``write_cycles_concurrent``, not forbidden.)
``nonmonotonic-poll``
    a stream's offsets going backwards (or repeating) in a partition.
``nonmonotonic-send``
    a writer's acknowledged offsets in one partition going backwards, in
    its send order.
``poll-skip``
    a stream covering the offset of a value it should hand out without
    reading it (read_committed: an effectively committed value;
    read_uncommitted: any acknowledged value), not already an
    intermediate read.
``hung-transaction``
    a transaction that began and never ended (no answer at all), a
    transactional id whose coordinator record is still ``Ongoing`` or
    ``Prepare*`` after the run healed, or a partition whose last stable
    offset stayed below its high watermark at the final read.
``offsets``
    a writer's input group's committed offset naming a
    transaction that effectively aborted, or going backwards between two
    reads, or below the offset of a committed transaction (missing
    included) in a read that began after the transaction was complete (the
    writer's next transaction ended: see :func:`_check_offsets`) or in the
    final read.
``zombie-commit``
    a producer dropped mid-transaction (the ``kill-producer`` fault) whose
    commit the coordinator accepted after a newer producer of its
    transactional id had started: the old epoch was not fenced.
``final-incomplete``
    a partition whose final read did not reach its last stable offset.

:func:`check` is pure: operations in, a JSON-ready report out.
"""

from __future__ import annotations

import bisect
import collections
from typing import Iterable

from raylog.testing.history import OK, UNKNOWN, by_process
from raylog.testing.txn_workload import ABORTED, COMMITTED, NOT_COMMITTED

LOST_WRITE = "lost-write"
DUPLICATE = "duplicate"
INCONSISTENT_OFFSET = "inconsistent-offset"
ABORTED_READ = "aborted-read"
INTERMEDIATE_READ = "intermediate-read"
WRITE_CYCLE = "write-cycle"
NONMONOTONIC_POLL = "nonmonotonic-poll"
NONMONOTONIC_SEND = "nonmonotonic-send"
POLL_SKIP = "poll-skip"
HUNG_TRANSACTION = "hung-transaction"
OFFSETS = "offsets"
ZOMBIE_COMMIT = "zombie-commit"
FINAL_INCOMPLETE = "final-incomplete"

ANOMALIES = (LOST_WRITE, DUPLICATE, INCONSISTENT_OFFSET, ABORTED_READ, INTERMEDIATE_READ, WRITE_CYCLE,
             NONMONOTONIC_POLL, NONMONOTONIC_SEND, POLL_SKIP, HUNG_TRANSACTION, OFFSETS, ZOMBIE_COMMIT,
             FINAL_INCOMPLETE)
#: the coordinator's states of a transaction not ended (raylog.zk.transactions)
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")
READ_COMMITTED = "read_committed"
EXAMPLES = 10


class _Found:
    """The anomalies found so far: a count and a few examples each."""

    def __init__(self):
        self.counts = {name: 0 for name in ANOMALIES}
        self.examples: dict[str, list] = {name: [] for name in ANOMALIES}

    def add(self, name: str, **example) -> None:
        self.counts[name] += 1
        if len(self.examples[name]) < EXAMPLES:
            self.examples[name].append(example)


class _Stream:
    """One reader's reads of one partition between two seeks."""

    def __init__(self, reader: str, isolation: str, partition: int, start: int | None):
        self.reader = reader
        self.isolation = isolation
        self.partition = partition
        self.start = start
        self.reads: list[tuple[int, str]] = []

    def covers(self, offset: int) -> bool:
        if not self.reads:
            return False
        low = self.reads[0][0] if self.start is None else min(self.start, self.reads[0][0])
        return low <= offset <= max(o for o, _ in self.reads)


def txn_of(value: str) -> str:
    """The transaction of a value ``"<writer>-t<n>-<i>"``."""
    return value.rsplit("-", 1)[0]


def check(ops: Iterable[dict]) -> dict:
    """The verdict on a transactional history (see the module docstring)."""
    ops = list(ops)
    found = _Found()
    begins = {op["txn"]: op for op in ops if op["type"] == "txn" and op["phase"] == "begin"}
    ends = {op["txn"]: op for op in ops if op["type"] == "txn" and op["phase"] == "end"}
    sends = [op for op in ops if op["type"] == "send"]
    acked = {op["value"]: op for op in sends if op["outcome"] == OK and op.get("offset") is not None}
    finals = {op["partition"]: op for op in ops if op["type"] == "final" and op.get("what") == "read"}
    final_values = {value: (p, offset) for p, op in finals.items() for offset, value in op["reads"]}

    # -- effective outcomes
    outcome: dict[str, str] = {}
    written: dict[str, list[str]] = {}
    for txn, begin in begins.items():
        end = ends.get(txn)
        if end is None:
            found.add(HUNG_TRANSACTION, what="began and never ended", txn=txn, t0=begin["t0"])
        values = list(end["values"]) if end is not None else []
        written[txn] = values
        stated = end["outcome"] if end is not None else UNKNOWN
        if stated == COMMITTED:
            outcome[txn] = COMMITTED
        elif stated in (ABORTED, NOT_COMMITTED):
            outcome[txn] = ABORTED
        else:
            outcome[txn] = COMMITTED if any(v in final_values for v in values) else ABORTED
    for txn, end in sorted(ends.items()):
        if end.get("zombie_commit") == "accepted":
            found.add(ZOMBIE_COMMIT, txn=txn, writer=end["process"])
    resolved = collections.Counter(
        (ends[t]["outcome"] if t in ends else "no end") + "->" + outcome[t]
        for t in outcome if t not in ends or ends[t]["outcome"] == UNKNOWN)

    # -- the final read: complete, the last stable offset at the high watermark, nothing lost
    for p, op in sorted(finals.items()):
        if not op.get("complete"):
            found.add(FINAL_INCOMPLETE, partition=p, position=op.get("position"), lso=op.get("lso"), hw=op.get("hw"))
        if op.get("lso") is None or op.get("hw") is None or op["lso"] < op["hw"]:
            found.add(HUNG_TRANSACTION, what="last stable offset below the high watermark after the run",
                      partition=p, lso=op.get("lso"), hw=op.get("hw"))
    for op in ops:
        if op["type"] == "final" and op.get("what") == "txn-state" and (
                op.get("state") in OPEN_STATES or op.get("error")):
            found.add(HUNG_TRANSACTION, what="the coordinator's record is not ended after the run",
                      transactional_id=op["transactional_id"], state=op.get("state"), error=op.get("error"))
    for txn, values in sorted(written.items()):
        if outcome[txn] != COMMITTED:
            continue
        for value in values:
            send = acked.get(value)
            p = send["partition"] if send is not None else None
            if value in final_values:
                continue
            if p is not None and p in finals and not finals[p].get("complete"):
                continue  # final-incomplete already
            found.add(LOST_WRITE, txn=txn, value=value, stated=ends[txn]["outcome"] if txn in ends else None,
                      acknowledged_at=None if send is None else [send["partition"], send["offset"]])

    # -- the streams
    streams = _streams(ops, finals)
    _check_reads(streams, acked, outcome, written, found)
    where = {}  # value -> (partition, offset) of committed values, for the cycles and the skips
    for value, send in acked.items():
        where[value] = (send["partition"], send["offset"])
    for value, at in final_values.items():
        where.setdefault(value, at)
    _check_skips(streams, acked, where, outcome, written, found)
    _check_sends(sends, found)
    cycles = _check_cycles(finals, outcome, begins, ends, found)
    _check_offsets(ops, ends, outcome, found)

    faults = collections.Counter(op["kind"] for op in ops if op["type"] == "fault")
    forbidden = sorted(name for name in ANOMALIES if found.counts[name])
    stated = collections.Counter(op["outcome"] for op in ends.values())
    reads = collections.Counter()
    for s in streams:
        reads[s.reader] += len(s.reads)
    return {
        "workload": "txn",
        "valid": not forbidden,
        "forbidden": forbidden,
        "counts": found.counts,
        "examples": {k: v for k, v in found.examples.items() if v},
        "operations": {
            "transactions": len(begins),
            "transactions_by_outcome": {k: stated.get(k, 0) for k in (COMMITTED, ABORTED, NOT_COMMITTED, UNKNOWN)},
            "unknown_resolved": dict(resolved),
            "with_offsets": sum(1 for op in ends.values() if op.get("offsets")),
            "sends": len(sends),
            "sends_acknowledged": len(acked),
            "committed_values": sum(len(written[t]) for t in written if outcome[t] == COMMITTED),
            "reads_by_reader": dict(reads),
            "final_reads": sum(len(op["reads"]) for op in finals.values()),
            "offsets_reads": sum(1 for op in ops if op["type"] == "offsets"),
            "zombie_commits_refused": sum(1 for op in ends.values() if op.get("zombie_commit") == "refused"),
        },
        "write_cycles_concurrent": cycles["concurrent"],
        "write_cycle_example": cycles["example"],
        "faults": dict(faults),
    }


def _streams(ops: list[dict], finals: dict) -> list[_Stream]:
    """Every reader's streams, then the final read's (one per partition)."""
    out: list[_Stream] = []
    for process, group in sorted(by_process(ops).items()):
        if not process.startswith("reader-"):
            continue
        isolation = next((op.get("isolation") for op in group if op["type"] == "start"), None)
        if isolation is None:
            isolation = READ_COMMITTED if "read-committed" in process else "read_uncommitted"
        current: dict[int, _Stream] = {}
        for op in group:
            if op["type"] == "seek":
                stream = _Stream(process, isolation, op["partition"], op["offset"])
                out.append(stream)
                current[op["partition"]] = stream
            elif op["type"] == "poll":
                for _topic, p, offset, value in op.get("reads") or ():
                    stream = current.get(p)
                    if stream is None:
                        stream = current[p] = _Stream(process, isolation, p, None)
                        out.append(stream)
                    stream.reads.append((offset, value))
    for p, op in sorted(finals.items()):
        stream = _Stream("final-reader", READ_COMMITTED, p, None)
        stream.reads = [(offset, value) for offset, value in op["reads"]]
        out.append(stream)
    return out


def _check_reads(streams, acked, outcome, written, found: _Found) -> None:
    at_offset: dict[tuple[int, int], str] = {}
    offsets_of: dict[str, set] = collections.defaultdict(set)
    for s in streams:
        previous = None
        for offset, value in s.reads:
            if previous is not None and offset <= previous:
                found.add(NONMONOTONIC_POLL, reader=s.reader, partition=s.partition, offset=offset,
                          previous=previous)
            previous = offset if previous is None else max(previous, offset)
            other = at_offset.setdefault((s.partition, offset), value)
            if other != value:
                found.add(INCONSISTENT_OFFSET, partition=s.partition, offset=offset, values=[other, value],
                          reader=s.reader)
            offsets_of[value].add((s.partition, offset))
            if s.isolation == READ_COMMITTED:
                txn = txn_of(value)
                if txn not in outcome or value not in written.get(txn, ()):
                    found.add(ABORTED_READ, what="no transaction wrote this value", reader=s.reader,
                              partition=s.partition, offset=offset, value=value)
                elif outcome[txn] != COMMITTED:
                    found.add(ABORTED_READ, reader=s.reader, partition=s.partition, offset=offset, value=value,
                              txn=txn)
    for value, places in sorted(offsets_of.items()):
        send = acked.get(value)
        if send is not None:
            places = places | {(send["partition"], send["offset"])}
        if len(places) > 1:
            found.add(DUPLICATE, value=value, at=sorted(places),
                      acknowledged_at=None if send is None else [send["partition"], send["offset"]])


def _check_skips(streams, acked, where, outcome, written, found: _Found) -> None:
    """Intermediate reads and poll skips of every stream."""
    by_partition: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    for value, (p, offset) in where.items():
        by_partition[p].append((offset, value))
    for entries in by_partition.values():
        entries.sort()
    for s in streams:
        if not s.reads:
            continue
        seen = {value for _, value in s.reads}
        low = s.reads[0][0] if s.start is None else min(s.start, s.reads[0][0])
        high = max(o for o, _ in s.reads)
        committed = s.isolation == READ_COMMITTED
        txns_seen = {txn_of(v) for v in seen}
        entries = by_partition.get(s.partition, [])
        for offset, value in entries[bisect.bisect_left(entries, (low, "")):]:
            if offset > high:
                break
            if value in seen:
                continue
            txn = txn_of(value)
            if committed and outcome.get(txn) != COMMITTED:
                continue
            if not committed and value not in acked:
                continue
            if committed and txn in txns_seen:
                found.add(INTERMEDIATE_READ, reader=s.reader, partition=s.partition, txn=txn, missed=value,
                          offset=offset, read=sorted(v for v in seen if txn_of(v) == txn))
            else:
                found.add(POLL_SKIP, reader=s.reader, isolation=s.isolation, partition=s.partition, value=value,
                          offset=offset, stream=[low, high])


def _check_sends(sends, found: _Found) -> None:
    last: dict[tuple[str, int], dict] = {}
    for op in sorted(sends, key=lambda op: (op["process"], op["seq"])):
        if op["outcome"] != OK or op.get("offset") is None:
            continue
        at = (op["process"], op["partition"])
        before = last.get(at)
        if before is not None and op["offset"] <= before["offset"]:
            found.add(NONMONOTONIC_SEND, writer=op["process"], partition=op["partition"],
                      values=[before["value"], op["value"]], offsets=[before["offset"], op["offset"]])
        last[at] = op


def _check_cycles(finals, outcome, begins, ends, found: _Found) -> dict:
    """The write graph of committed transactions (T1 -> T2 when T1's write
    precedes T2's in a partition, by offset in the final read): its cycles
    (strongly connected components) are counted, not forbidden (KIP-98
    does not isolate concurrent transactions' writes); forbidden is a write
    edge against real time: a write at a lower offset than a write of a
    transaction whose commit was acknowledged before the first began."""
    graph: dict[str, set] = collections.defaultdict(set)
    for p, op in sorted(finals.items()):
        before = None
        for _offset, value in op["reads"]:
            txn = txn_of(value)
            if outcome.get(txn) != COMMITTED:
                continue
            if before is not None and before != txn:
                graph[before].add(txn)
            before = txn
        # from the end: the earliest acknowledged commit among the writes above
        earliest: tuple[float, str, int] | None = None
        for offset, value in reversed(op["reads"]):
            txn = txn_of(value)
            if outcome.get(txn) != COMMITTED or txn not in begins:
                continue
            if earliest is not None and earliest[1] != txn and earliest[0] < begins[txn]["t0"]:
                found.add(WRITE_CYCLE, what="a write below that of a transaction committed before it began",
                          partition=p, txn=txn, value=value, offset=offset, began=begins[txn]["t0"],
                          above_txn=earliest[1], above_offset=earliest[2], above_committed_at=earliest[0])
            end = ends.get(txn)
            if end is not None and end["outcome"] == COMMITTED and (earliest is None or end["t1"] < earliest[0]):
                earliest = (end["t1"], txn, offset)
    cycles = [sorted(c) for c in strongly_connected(graph) if len(c) > 1]
    return {"concurrent": len(cycles), "example": cycles[0][:10] if cycles else None}


def strongly_connected(graph: dict) -> list[list]:
    """Tarjan's strongly connected components of ``{node: successors}``
    (iterative: a deep graph does not reach the recursion limit)."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    out: list[list] = []
    counter = 0
    nodes = set(graph)
    for successors in graph.values():
        nodes |= successors
    for root in sorted(nodes, key=repr):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()), key=repr)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ()), key=repr))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(component)
    return out


def _check_offsets(ops, ends, outcome, found: _Found) -> None:
    """The input groups' offsets: those of committed transactions visible
    once complete, those of aborted ones never.

    A commit is acknowledged once the coordinator wrote its decision; the
    offsets become visible when it completes the transaction (its markers
    written, then the offsets with the ``Complete`` record), which a fault
    can delay. The writer's next transaction cannot pass the coordinator
    before that completion, so a committed transaction's offsets must be
    visible to every read that began after the writer's next transaction
    ended with an acknowledged outcome (committed or aborted), and to the
    final read."""
    named: dict[tuple[str, int], str] = {}  # (group, offset) -> the transaction that committed it
    due: dict[str, list[tuple[float, int, str]]] = collections.defaultdict(list)
    by_writer: dict[str, list[dict]] = collections.defaultdict(list)
    for end in ends.values():
        by_writer[end["process"]].append(end)
        for key, offset in (end.get("offsets") or {}).items():
            named[(key, offset)] = end["txn"]
    for writer_ends in by_writer.values():
        writer_ends.sort(key=lambda op: op["seq"])
        for i, end in enumerate(writer_ends):
            if end["outcome"] != COMMITTED or not end.get("offsets"):
                continue
            later = next((e for e in writer_ends[i + 1:] if e["outcome"] in (COMMITTED, ABORTED)), None)
            for key, offset in end["offsets"].items():
                due[key].append((float("inf") if later is None else later["t1"], offset, end["txn"]))
    reads = sorted((op for op in ops
                    if op["type"] == "offsets" or (op["type"] == "final" and op.get("what") == "offsets")),
                   key=lambda op: op["t0"])
    last: dict[str, int] = {}
    for op in reads:
        offsets = op.get("offsets")
        if offsets is None:
            continue
        final = op["type"] == "final"
        for key, offset in offsets.items():
            txn = named.get((key, offset))
            if txn is None or outcome.get(txn) != COMMITTED:
                found.add(OFFSETS, what="an offset no committed transaction committed", key=key, offset=offset,
                          txn=txn, read_at=op["t0"])
            if key in last and offset < last[key]:
                found.add(OFFSETS, what="went backwards", key=key, offsets=[last[key], offset], read_at=op["t0"])
            last[key] = max(offset, last.get(key, offset))
        for key, entries in due.items():
            before = [(offset, txn) for visible_from, offset, txn in entries if final or visible_from < op["t0"]]
            if before and (offsets.get(key) is None or offsets[key] < max(before)[0]):
                found.add(OFFSETS, what="a committed transaction's offset not visible once it completed", key=key,
                          expected_at_least=max(before)[0], txn=max(before)[1], read=offsets.get(key),
                          read_at=op["t0"], final=final)
