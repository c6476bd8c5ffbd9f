"""The checker of the compaction workload: docs/design.md §6's compaction
guarantee, read off a history (:mod:`raylog.testing.compaction_workload`).

"On a compacted topic a reader from the log start sees, for every key, at
least the latest record written before the cleaned point (a tombstone while
``delete_retention_ms`` lasts), in offset order; no offset ever changes and
no removed record comes back."

The history holds the writers' ``send`` operations (``id``, ``key``,
``value`` or None for a delete, ``outcome``, ``partition``/``offset`` when
acknowledged) and the scanner's ``scan`` operations (one a partition and
scan: ``start``, ``end`` the position reached, ``reads`` ``[[offset, key,
value], ...]``, ``final`` for the last scan, after the faults healed and the
cleaner had ``delete_retention_ms`` and some passes more). Outcomes are read
as Jepsen does: an ``unknown`` write may or may not be stored, a ``failed``
one is certainly not.

Anomalies (each forbidden):

``lost-latest``
    a key's latest acknowledged write (the highest acknowledged offset of
    the key) is not what the final scan shows as the key's latest record,
    and no later write of the key (one whose outcome is unknown) is there
    instead: the value is gone, or an older record of the key stands last,
    or a delete younger than ``delete_retention_ms`` at the scan (from the
    invocation of its send to the scan's start) is gone. (For a delete, an older *value*
    standing last is ``resurrected`` instead.)
``resurrected``
    a key whose latest acknowledged write is a delete shows, as its latest
    record in the final scan, a value written before that delete: the key is
    back. (Once the delete is older than ``delete_retention_ms`` it may be
    gone, with every older record of the key.)
``offset-anomaly``
    a scan's offsets not strictly increasing (a repeated offset or one going
    back); a record read at an offset other than the one its write was
    acknowledged at, or an acknowledged position holding another record;
    the records of a key read in an order other than their writer's; or one
    writer's acknowledgements of a partition in an order other than its sends.
``record-back``
    a record read at an offset that an earlier scan covered (``start <=
    offset < end``) and did not read: a removed record came back.
``unexpected-record``
    a record no write could have stored: an unknown id, a key other than
    its write's, or a write whose outcome was ``failed``.

Besides, ``final-incomplete`` is forbidden: a partition whose final scan did
not reach the high watermark (nothing could be checked there).

:func:`check` is pure: operations in, a JSON-ready report out.
"""

from __future__ import annotations

import collections
from typing import Iterable

from raylog.testing.history import FAILED, OK

LOST_LATEST = "lost-latest"
RESURRECTED = "resurrected"
OFFSET_ANOMALY = "offset-anomaly"
RECORD_BACK = "record-back"
UNEXPECTED_RECORD = "unexpected-record"
FINAL_INCOMPLETE = "final-incomplete"

ANOMALIES = (LOST_LATEST, RESURRECTED, OFFSET_ANOMALY, RECORD_BACK, UNEXPECTED_RECORD, FINAL_INCOMPLETE)
#: examples kept per anomaly in the report
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


def check(ops: Iterable[dict], *, delete_retention_ms: int) -> dict:
    """The verdict on a compaction history (see the module docstring)."""
    ops = list(ops)
    sends = [op for op in ops if op["type"] == "send"]
    scans = sorted((op for op in ops if op["type"] == "scan"), key=lambda op: (op["t0"], op["seq"]))
    found = _Found()

    by_id = {op["id"]: op for op in sends}
    acked_at: dict[tuple[int, int], dict] = {}
    for op in sends:
        if op["outcome"] == OK and op.get("offset") is not None:
            at = (op["partition"], op["offset"])
            if at in acked_at:
                found.add(OFFSET_ANOMALY, what="two writes acknowledged at one offset", partition=at[0],
                          offset=at[1], ids=[acked_at[at]["id"], op["id"]])
            acked_at[at] = op

    _check_ack_order(sends, found)
    for scan in scans:
        _check_scan(scan, by_id, acked_at, found)
    _check_records_back(scans, found)
    latest = _check_latest(sends, scans, delete_retention_ms, found)

    outcomes = collections.Counter(op["outcome"] for op in sends)
    faults = collections.Counter(op["kind"] for op in ops if op["type"] == "fault")
    forbidden = sorted(name for name in ANOMALIES if found.counts[name])
    return {
        "workload": "compact",
        "valid": not forbidden,
        "forbidden": forbidden,
        "counts": found.counts,
        "examples": {k: v for k, v in found.examples.items() if v},
        "operations": {
            "sends": len(sends),
            "sends_by_outcome": {k: outcomes.get(k, 0) for k in (OK, FAILED, "unknown")},
            "deletes": sum(1 for op in sends if op.get("delete")),
            "deletes_acknowledged": sum(1 for op in sends if op.get("delete") and op["outcome"] == OK),
            "partition_scans": sum(1 for op in scans if not op.get("final")),
            "final_reads": sum(len(op["reads"]) for op in scans if op.get("final")),
        },
        "keys": latest,
        "faults": dict(faults),
        "delete_retention_ms": delete_retention_ms,
    }


def _check_ack_order(sends: list[dict], found: _Found) -> None:
    """One writer's acknowledged offsets of a partition grow with its sends."""
    last: dict[tuple[str, int], dict] = {}
    for op in sorted(sends, key=lambda op: (op["process"], op["seq"])):
        if op["outcome"] != OK or op.get("offset") is None:
            continue
        at = (op["process"], op["partition"])
        before = last.get(at)
        if before is not None and _send_number(op) > _send_number(before) and op["offset"] < before["offset"]:
            found.add(OFFSET_ANOMALY, what="acknowledged out of send order", partition=op["partition"],
                      ids=[before["id"], op["id"]], offsets=[before["offset"], op["offset"]])
        last[at] = op


def _send_number(op: dict) -> int:
    """The writer's send number of a send (its id ends with it)."""
    return int(op["id"].rsplit("-", 1)[1])


def _write_of(read, partition: int, by_id: dict, acked_at: dict):
    """The send that stored a read record, when it can be told (a value by
    its id; a delete by the acknowledgement at its offset), else None."""
    offset, _key, value = read
    if value is not None:
        return by_id.get(value)
    return acked_at.get((partition, offset))


def _check_scan(scan: dict, by_id: dict, acked_at: dict, found: _Found) -> None:
    p = scan["partition"]
    previous = None
    last_of_key: dict[str, tuple[int, dict]] = {}
    for read in scan["reads"]:
        offset, key, value = read
        if previous is not None and offset <= previous:
            found.add(OFFSET_ANOMALY, what="repeated offset" if offset == previous else "offset went back",
                      partition=p, offset=offset, previous=previous, scan_t0=scan["t0"])
        previous = offset if previous is None else max(previous, offset)
        acked = acked_at.get((p, offset))
        if value is not None:
            write = by_id.get(value)
            if write is None or write["key"] != key:
                found.add(UNEXPECTED_RECORD, what="no write stored this record", partition=p, offset=offset,
                          key=key, value=value)
                continue
            if write["outcome"] == FAILED:
                found.add(UNEXPECTED_RECORD, what="a failed write was stored", partition=p, offset=offset,
                          id=write["id"])
            if write["outcome"] == OK and write.get("offset") is not None and write["offset"] != offset:
                found.add(OFFSET_ANOMALY, what="read at another offset than acknowledged", partition=p,
                          offset=offset, acknowledged=write["offset"], id=write["id"])
            elif acked is not None and acked is not write:
                found.add(OFFSET_ANOMALY, what="an acknowledged offset holds another record", partition=p,
                          offset=offset, read=write["id"], acknowledged=acked["id"])
        elif acked is not None and (not acked.get("delete") or acked["key"] != key):
            found.add(OFFSET_ANOMALY, what="an acknowledged offset holds another record", partition=p,
                      offset=offset, read=f"a delete of {key}", acknowledged=acked["id"])
        write = _write_of(read, p, by_id, acked_at)
        if write is None:
            continue
        before = last_of_key.get(key)
        if before is not None and before[1]["process"] == write["process"] and \
                _send_number(write) < _send_number(before[1]):
            found.add(OFFSET_ANOMALY, what="a key's records out of write order", partition=p, key=key,
                      offsets=[before[0], offset], ids=[before[1]["id"], write["id"]])
        last_of_key[key] = (offset, write)


def _check_records_back(scans: list[dict], found: _Found) -> None:
    """A record an earlier scan covered and did not read is never read later."""
    earlier: dict[int, list[tuple[int, int, frozenset]]] = collections.defaultdict(list)
    for scan in scans:
        p = scan["partition"]
        offsets = frozenset(r[0] for r in scan["reads"])
        for offset in sorted(offsets):
            for start, end, seen in earlier[p]:
                if start <= offset < end and offset not in seen:
                    found.add(RECORD_BACK, partition=p, offset=offset, absent_in_scan_covering=[start, end],
                              scan_t0=scan["t0"])
                    break
        if scan.get("start") is not None and scan.get("end") is not None:
            earlier[p].append((scan["start"], scan["end"], offsets))


def _check_latest(sends: list[dict], scans: list[dict], delete_retention_ms: int, found: _Found) -> dict:
    """Per key: the final scan's latest record is the latest acknowledged
    write, or a later write whose outcome is unknown."""
    finals = {}
    for scan in scans:
        if scan.get("final"):
            finals[scan["partition"]] = scan  # the last final scan of each partition
    for p, scan in sorted(finals.items()):
        if not scan.get("complete"):
            found.add(FINAL_INCOMPLETE, partition=p, reached=scan.get("end"), hw=scan.get("hw"),
                      error=scan.get("error"))
    latest_acked: dict[str, dict] = {}
    for op in sends:
        if op["outcome"] == OK and op.get("offset") is not None:
            best = latest_acked.get(op["key"])
            if best is None or op["offset"] > best["offset"]:
                latest_acked[op["key"]] = op
    shown: dict[tuple[int, str], list] = {}
    for p, scan in finals.items():
        for read in scan["reads"]:
            offset, key, _value = read
            if (p, key) not in shown or offset > shown[(p, key)][0]:
                shown[(p, key)] = read
    summary = {"acknowledged": len(latest_acked), "latest_value": 0, "latest_delete": 0,
               "delete_kept": 0, "delete_gone": 0, "later_unknown_write": 0}
    for key, last in sorted(latest_acked.items()):
        p = last["partition"]
        scan = finals.get(p)
        if scan is None or not scan.get("complete"):
            continue  # final-incomplete already
        summary["latest_delete" if last.get("delete") else "latest_value"] += 1
        read = shown.get((p, key))
        if read is not None and read[0] > last["offset"]:
            summary["later_unknown_write"] += 1  # the later record itself is checked by _check_scan
            continue
        if read is not None and read[0] == last["offset"]:
            if last.get("delete"):
                summary["delete_kept"] += 1
            continue  # the same record (a mismatch there is an offset anomaly)
        # from the send's invocation: the record's timestamp is no older, so the
        # cleaner never found it older than this
        age_ms = (scan["t0"] - last["t0"]) * 1000.0
        example = dict(key=key, partition=p, latest_acknowledged={"id": last["id"], "offset": last["offset"],
                                                                  "delete": bool(last.get("delete"))},
                       shown=None if read is None else {"offset": read[0], "value": read[2]},
                       age_at_scan_ms=round(age_ms))
        if not last.get("delete"):
            found.add(LOST_LATEST, **example)
        elif read is not None and read[2] is not None:
            found.add(RESURRECTED, **example)
        elif age_ms < delete_retention_ms:
            found.add(LOST_LATEST, **example, why="a delete gone before delete_retention_ms")
        else:
            summary["delete_gone"] += 1
    return summary
