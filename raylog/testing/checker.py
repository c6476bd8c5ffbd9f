"""The checker: reads a whole history and names what went wrong, Jepsen's way.

Anomalies (the names of Jepsen's Kafka queue workload):

``lost-write``
    a send acknowledged at ``offset`` of a partition was never read, though
    consumers read that partition past ``offset``;
``unseen``
    a send acknowledged and never read by the end, and nothing past it was
    read either (counted per acks level: ``unseen`` for acks ``"all"`` is
    forbidden, for acks ``1`` it is reported);
``duplicate``
    one value stored at two positions (two reads at different positions, or
    an acknowledgement and a read that disagree);
``inconsistent-offsets``
    two values at one position (two reads, an acknowledgement and a read, or
    two acknowledgements from different producers);
``nonmonotonic-poll``
    one consumer's reads of one partition went backwards or repeated a
    position, within a poll or from one poll to the next, with no rebalance
    (``assign``/``revoke``) or ``seek`` of that partition in between;
``poll-skip``
    one consumer's consecutive reads of a partition jumped over a position
    that exists (read by someone or acknowledged), again with no rebalance or
    seek in between;
``garbage-read``
    a value was read that no send ever produced (damaged data served).

**Acknowledgements that replication may drop.** With replication, an
``acks=1`` acknowledgement says the leader appended the set, not that any
follower has it: a leader change before the followers fetched it truncates it
(Kafka's semantics). The acks levels passed as ``lossy_acks`` are checked so:
their lost and unseen writes are counted (``lost_by_acks``,
``unseen_by_acks``) but do not make the history invalid, and the
acknowledged position of such a send that nobody ever read is not taken as
what the log holds there (no ``poll-skip`` or ``inconsistent-offsets`` from
it). Everything else about them (a value read twice, read garbage) still
counts.

Besides, **delivery duplicates** (one value handed to the group more than
once) are counted: at-least-once allows them after faults.

**Positions inside compressed wrappers.** Every message has an offset of its
own (the i-th inner message of a wrapper at ``w`` reports ``w + i``,
docs/design.md §2), so a position is ``(offset, 0)``. Only a wrapper written
before wrappers were padded to their count can give several messages one
offset (its offsets are clamped to its last byte), so a position is
``(offset, index)``: the index is counted along each stream: a read at the
offset of the previous read is the next index, unless its value is the
first value read at that offset again (re-read from there). An
acknowledgement carries the offset only; it agrees with a read at any index
of that offset.

**Damaged messages.** A ``flip-byte`` fault names the message it damaged;
acknowledged values at that position are counted as ``destroyed`` instead of
lost: their loss is the fault's, and the guarantee checked there is that the
damage is detected (a ``garbage-read`` otherwise).

:func:`check` is pure: it takes the operations (see
:mod:`raylog.testing.history`) and returns a JSON-ready report.
"""

from __future__ import annotations

import bisect
import collections
from typing import Iterable

from raylog.testing.history import OK, by_process

LOST_WRITE = "lost-write"
UNSEEN = "unseen"
DUPLICATE = "duplicate"
INCONSISTENT_OFFSETS = "inconsistent-offsets"
NONMONOTONIC_POLL = "nonmonotonic-poll"
POLL_SKIP = "poll-skip"
GARBAGE_READ = "garbage-read"

ANOMALIES = (LOST_WRITE, UNSEEN, DUPLICATE, INCONSISTENT_OFFSETS, NONMONOTONIC_POLL, POLL_SKIP, GARBAGE_READ)
#: acks levels whose unseen writes make a history invalid by default
FORBID_UNSEEN_ACKS = ("all",)
#: examples kept per anomaly in the report
EXAMPLES = 20


class _Stream:
    """One consumer's reads of one partition since its last rebalance or seek."""

    __slots__ = ("last", "wrapper_offset", "wrapper_first", "next_index")

    def __init__(self):
        self.last = None  # (offset, index) of the last read
        self.wrapper_offset = None
        self.wrapper_first = None
        self.next_index = 0

    def position_of(self, offset: int, value: str) -> tuple[int, int]:
        if offset == self.wrapper_offset and value != self.wrapper_first:
            index = self.next_index
            self.next_index += 1
        else:
            index = 0
            self.wrapper_offset, self.wrapper_first, self.next_index = offset, value, 1
        return offset, index


def _tp(topic, partition) -> tuple[str, int]:
    return topic, int(partition)


def check(ops: Iterable[dict], *, forbid_unseen_acks: Iterable[str] = FORBID_UNSEEN_ACKS,
          lossy_acks: Iterable[str] = ()) -> dict:
    """Check a history; returns the report (``report["valid"]`` is False when a
    forbidden anomaly occurred). See the module docstring for the names."""
    ops = list(ops)
    forbid_unseen_acks = {str(a) for a in forbid_unseen_acks}
    lossy = {str(a) for a in lossy_acks}
    forbid_unseen_acks -= lossy
    found: dict[str, list[dict]] = {name: [] for name in ANOMALIES}

    def flag(name: str, **detail):
        found[name].append(detail)

    # -- sends ---------------------------------------------------------------
    sends: dict[str, dict] = {}
    acked_at: dict[tuple, list[dict]] = collections.defaultdict(list)  # (tp, offset) -> ok sends
    outcome_counts = collections.Counter()
    for op in ops:
        if op["type"] != "send":
            continue
        sends[op["value"]] = op
        outcome_counts[op["outcome"]] += 1
        if op["outcome"] == OK and op.get("offset") is not None and op.get("partition") is not None:
            acked_at[(_tp(op["topic"], op["partition"]), op["offset"])].append(op)

    # -- reads, stream by stream ---------------------------------------------
    reads_at: dict[tuple, set] = collections.defaultdict(set)  # (tp, offset, index) -> values
    positions_of: dict[str, set] = collections.defaultdict(set)  # value -> {(tp, offset, index)}
    deliveries = collections.Counter()  # value -> times read
    first_read_t: dict[str, float] = {}
    max_read_offset: dict[tuple, int] = {}
    read_times: dict[tuple, list[float]] = collections.defaultdict(list)
    steps = []  # (tp, previous position, position, process, seq)
    reads_total = 0
    polls = commits = 0
    for process, pops in by_process(ops).items():
        streams: dict[tuple, _Stream] = {}
        for op in pops:
            kind = op["type"]
            if kind in ("assign", "revoke"):
                for topic, partition in op.get("partitions") or ():
                    streams.pop(_tp(topic, partition), None)
            elif kind == "seek":
                streams.pop(_tp(op["topic"], op["partition"]), None)
            elif kind in ("start", "stop"):
                streams.clear()
            elif kind == "commit":
                commits += 1
            elif kind == "poll":
                polls += 1
                for topic, partition, offset, value in op.get("reads") or ():
                    reads_total += 1
                    tp = _tp(topic, partition)
                    stream = streams.get(tp)
                    if stream is None:
                        stream = streams[tp] = _Stream()
                    pos = stream.position_of(offset, value)
                    if stream.last is not None:
                        if pos <= stream.last:
                            flag(
                                NONMONOTONIC_POLL, process=process, seq=op["seq"], topic=tp[0], partition=tp[1],
                                previous=list(stream.last), read=list(pos), value=value,
                            )
                        else:
                            steps.append((tp, stream.last, pos, process, op["seq"]))
                    stream.last = pos
                    reads_at[(tp, offset, pos[1])].add(value)
                    positions_of[value].add((tp, offset, pos[1]))
                    deliveries[value] += 1
                    first_read_t.setdefault(value, op["t1"])
                    if offset > max_read_offset.get(tp, -1):
                        max_read_offset[tp] = offset
                    read_times[tp].append(op["t1"])
                    if value not in sends:
                        flag(GARBAGE_READ, process=process, seq=op["seq"], topic=tp[0], partition=tp[1],
                             offset=offset, value=value)

    # -- acknowledgements replication may have dropped: not what the log holds
    for key in [k for k, acks in acked_at.items() if any(str(a.get("acks")) in lossy for a in acks)]:
        kept = [a for a in acked_at[key] if str(a.get("acks")) not in lossy or a["value"] in deliveries]
        if kept:
            acked_at[key] = kept
        else:
            del acked_at[key]

    # -- poll-skip: consecutive reads that jump over a known position ---------
    known: dict[tuple, set] = collections.defaultdict(set)
    for tp, offset, index in reads_at:
        known[tp].add((offset, index))
    for tp, offset in acked_at:
        known[tp].add((offset, 0))
    order = {tp: sorted(positions) for tp, positions in known.items()}
    for tp, prev, pos, process, seq in steps:
        positions = order[tp]
        i, j = bisect.bisect_left(positions, prev), bisect.bisect_left(positions, pos)
        if j - i > 1:
            flag(
                POLL_SKIP, process=process, seq=seq, topic=tp[0], partition=tp[1], previous=list(prev),
                read=list(pos), skipped=[list(p) for p in positions[i + 1 : min(j, i + 6)]], skipped_count=j - i - 1,
            )

    # -- inconsistent offsets -------------------------------------------------
    for (tp, offset, index), values in reads_at.items():
        if len(values) > 1:
            flag(INCONSISTENT_OFFSETS, topic=tp[0], partition=tp[1], offset=offset, index=index,
                 values=sorted(values)[:10], seen_by="reads")
    for (tp, offset), acks in acked_at.items():
        producers = {a["process"] for a in acks}
        plain = [a for a in acks if not a.get("codec")]
        if len(producers) > 1 or len(plain) > 1:
            flag(INCONSISTENT_OFFSETS, topic=tp[0], partition=tp[1], offset=offset,
                 values=sorted(a["value"] for a in acks)[:10], seen_by="acknowledgements")
    read_offsets: dict[tuple, set] = collections.defaultdict(set)
    for (tp, offset, index), values in reads_at.items():
        read_offsets[(tp, offset)].update(values)
    for key, values in read_offsets.items():
        acks = acked_at.get(key)
        if not acks:
            continue
        acked_values = {a["value"] for a in acks}
        for value in sorted(values - acked_values):
            other = sends.get(value)
            acked_elsewhere = other is not None and other["outcome"] == OK and other.get("offset") is not None
            if not acked_elsewhere:  # a value acknowledged elsewhere is a duplicate, flagged below
                flag(INCONSISTENT_OFFSETS, topic=key[0][0], partition=key[0][1], offset=key[1],
                     values=[sorted(acked_values)[0], value], seen_by="acknowledgement and read")

    # -- duplicates: one value at two positions -------------------------------
    for value, positions in positions_of.items():
        offsets = {(tp, offset) for tp, offset, _ in positions}
        send = sends.get(value)
        acked = None
        if send is not None and send["outcome"] == OK and send.get("offset") is not None:
            acked = (_tp(send["topic"], send["partition"]), send["offset"])
            offsets.add(acked)
        if len(offsets) > 1 or len(positions) > 1:
            flag(
                DUPLICATE, value=value,
                read_at=sorted([tp[0], tp[1], o, i] for tp, o, i in positions)[:10],
                acknowledged_at=None if acked is None else [acked[0][0], acked[0][1], acked[1]],
            )

    # -- lost and unseen writes -----------------------------------------------
    destroyed_positions = set()
    faults = collections.Counter()
    flips = collections.Counter()
    for op in ops:
        if op["type"] == "fault":
            faults[op["kind"]] += 1
            detail = op.get("detail") or {}
            if op["kind"] == "flip-byte" and detail.get("offset") is not None:
                destroyed_positions.add((_tp(detail["topic"], detail["partition"]), detail["offset"]))
                flips[{True: "detected", False: "served", None: "not read back"}[detail.get("detected")]] += 1
    destroyed = 0
    unseen_by_acks = collections.Counter()
    lost_by_acks = collections.Counter()
    failed_read = unknown_read = 0
    for value, send in sends.items():
        read = value in deliveries
        if send["outcome"] != OK:
            if read:
                if send["outcome"] == "failed":
                    failed_read += 1
                else:
                    unknown_read += 1
            continue
        if read:
            continue
        partition, offset = send.get("partition"), send.get("offset")
        tp = None if partition is None else _tp(send["topic"], partition)
        if tp is not None and offset is not None and (tp, offset) in destroyed_positions:
            destroyed += 1
            continue
        detail = dict(value=value, process=send["process"], topic=send["topic"], partition=partition,
                      offset=offset, acks=str(send.get("acks")), acknowledged_t=send["t1"])
        if tp is not None and offset is not None and max_read_offset.get(tp, -1) > offset:
            lost_by_acks[str(send.get("acks"))] += 1
            flag(LOST_WRITE, read_up_to=max_read_offset[tp], **detail)
        else:
            unseen_by_acks[str(send.get("acks"))] += 1
            flag(UNSEEN, **detail)

    counts = {name: len(found[name]) for name in ANOMALIES}
    forbidden = {name: n for name, n in counts.items() if name not in (UNSEEN, LOST_WRITE) and n}
    lost_forbidden = sum(n for acks, n in lost_by_acks.items() if acks not in lossy)
    if lost_forbidden:
        forbidden[LOST_WRITE] = lost_forbidden
    unseen_forbidden = sum(n for acks, n in unseen_by_acks.items() if acks in forbid_unseen_acks)
    if unseen_forbidden:
        forbidden[UNSEEN] = unseen_forbidden

    extra = sum(n - 1 for n in deliveries.values() if n > 1)
    latencies = sorted(
        first_read_t[v] - s["t1"] for v, s in sends.items() if s["outcome"] == OK and v in first_read_t
    )
    return {
        "valid": not forbidden,
        "forbidden": forbidden,
        "counts": counts,
        "unseen_by_acks": dict(sorted(unseen_by_acks.items())),
        "lost_by_acks": dict(sorted(lost_by_acks.items())),
        "lossy_acks": sorted(lossy),
        "anomalies": {name: found[name][:EXAMPLES] for name in ANOMALIES if found[name]},
        "delivery_duplicates": {
            "values": sum(1 for n in deliveries.values() if n > 1),
            "extra_deliveries": extra,
        },
        "operations": {
            "sends": len(sends),
            "sends_by_outcome": dict(sorted(outcome_counts.items())),
            "polls": polls,
            "reads": reads_total,
            "distinct_values_read": len(deliveries),
            "commits": commits,
        },
        "faults": dict(sorted(faults.items())),
        "destroyed_by_faults": destroyed,
        # flipped bytes read back through the data path: "served" ones show up as garbage-read
        "flipped_bytes": dict(sorted(flips.items())),
        "failed_but_read": failed_read,
        "unknown_read": unknown_read,
        "longest_unread_s": _longest_unread(read_times, ops),
        "longest_unacknowledged_s": _longest_unacknowledged(ops),
        "latency_s": {
            "p50": _quantile(latencies, 0.5),
            "p99": _quantile(latencies, 0.99),
            "max": latencies[-1] if latencies else None,
        },
    }


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _longest_unread(read_times: dict[tuple, list[float]], ops: list[dict]) -> dict:
    """Per partition, the longest time between two reads of it (from the first
    acknowledged send of the run to the last read of anything): how long the
    group left a partition unread, faults included."""
    ack_times = [op["t1"] for op in ops if op["type"] == "send" and op["outcome"] == OK]
    if not ack_times or not read_times:
        return {"max": None, "partition": None, "per_partition": {}}
    start = min(ack_times)
    end = max(max(times) for times in read_times.values())
    partitions = {(op["topic"], op["partition"]) for op in ops
                  if op["type"] == "send" and op["outcome"] == OK and op.get("partition") is not None}
    partitions.update(read_times)
    per = {}
    for tp in sorted(partitions):
        times = sorted(t for t in read_times.get(tp, ()) if t >= start)
        edges = [start] + times + [end]
        per[f"{tp[0]}/{tp[1]}"] = round(max(b - a for a, b in zip(edges, edges[1:])), 3)
    worst = max(per, key=per.get)
    return {"max": per[worst], "partition": worst, "per_partition": per}


def _longest_unacknowledged(ops: list[dict]) -> dict:
    """Per producer, the longest time between two acknowledgements (from its
    first send to its last): how long it was held up, faults included."""
    per = {}
    sends = collections.defaultdict(list)
    for op in ops:
        if op["type"] == "send":
            sends[op["process"]].append(op)
    for process, pops in sorted(sends.items()):
        start = min(op["t0"] for op in pops)
        end = max(op["t1"] for op in pops)
        acks = sorted(op["t1"] for op in pops if op["outcome"] == OK)
        edges = [start] + acks + [end]
        per[process] = round(max(b - a for a, b in zip(edges, edges[1:])), 3)
    if not per:
        return {"max": None, "producer": None, "per_producer": {}}
    worst = max(per, key=per.get)
    return {"max": per[worst], "producer": worst, "per_producer": per}
