"""The compaction checker on hand-made histories: each anomaly is found,
and a valid history (compaction gaps, a later write of unknown outcome, a
delete gone after delete_retention_ms) is VALID."""

from __future__ import annotations

import pytest

from raylog.testing.compaction_checker import (
    FINAL_INCOMPLETE, LOST_LATEST, OFFSET_ANOMALY, RECORD_BACK, RESURRECTED, UNEXPECTED_RECORD, check,
)

RETENTION_MS = 3000


class History:
    """Builds a history: one writer ``w`` (sends numbered in order), scans."""

    def __init__(self):
        self.ops = []
        self.n = 0
        self.seq = {}

    def _op(self, process, type, t0, t1, **fields):
        seq = self.seq.get(process, 0)
        self.seq[process] = seq + 1
        op = {"process": process, "seq": seq, "type": type, "t0": t0, "t1": t1, **fields}
        self.ops.append(op)
        return op

    def send(self, key, offset=None, *, delete=False, outcome="ok", t=0.0, partition=0):
        ident = f"w-{self.n}"
        self.n += 1
        self._op("w", "send", t, t + 0.01, topic="compacted", id=ident, value=None if delete else ident,
                 delete=delete, key=key, acks="all", outcome=outcome,
                 partition=partition if outcome == "ok" else None, offset=offset if outcome == "ok" else None)
        return ident

    def scan(self, reads, *, t=100.0, final=True, start=0, end=None, complete=True, partition=0):
        end = end if end is not None else (max((r[0] for r in reads), default=-1) + 1)
        self._op("scanner", "scan", t, t + 0.1, topic="compacted", partition=partition, start=start, end=end,
                 hw=end, reads=[list(r) for r in reads], final=final, complete=complete, error=None)


def verdict(h: History) -> dict:
    return check(h.ops, delete_retention_ms=RETENTION_MS)


def test_a_compacted_history_with_gaps_unknown_writes_and_old_deletes_gone_is_valid():
    h = History()
    a0 = h.send("a", 0)
    b1 = h.send("b", 1)
    h.send("a", 2)                   # a's value overwritten below
    a3 = h.send("a", 3)              # a's latest acknowledged value
    h.send("b", 4, delete=True)      # b deleted long before the final scan: may be gone, with b1
    c5 = h.send("c", 5)
    c_unknown = h.send("c", outcome="unknown")  # stored at 6: may be there
    h.send("d", outcome="unknown")   # never stored: fine too
    h.send("e", 7, delete=True)      # e's delete, young at a mid-run scan: there
    h.scan([(0, "a", a0), (1, "b", b1), (3, "a", a3), (4, "b", None), (5, "c", c5), (6, "c", c_unknown),
            (7, "e", None)], t=1.0, final=False)
    h.scan([(3, "a", a3), (5, "c", c5), (6, "c", c_unknown)], t=100.0, end=8)
    report = verdict(h)
    assert report["valid"], report
    assert report["keys"]["delete_gone"] == 2  # b and e
    assert report["keys"]["later_unknown_write"] == 1  # c


def test_a_latest_acknowledged_value_missing_is_lost_latest():
    h = History()
    a0 = h.send("a", 0)
    h.send("a", 1)  # acknowledged, then gone
    h.scan([(0, "a", a0)], end=2)
    report = verdict(h)
    assert report["forbidden"] == [LOST_LATEST]
    assert report["examples"][LOST_LATEST][0]["latest_acknowledged"]["offset"] == 1


def test_a_key_entirely_gone_is_lost_latest():
    h = History()
    h.send("a", 0)
    h.send("b", 1)
    h.scan([(1, "b", "w-1")], end=2)
    assert verdict(h)["forbidden"] == [LOST_LATEST]


def test_a_young_delete_gone_is_lost_latest_an_old_one_is_not():
    young = History()
    young.send("a", 0, t=99.0)
    young.send("a", 1, delete=True, t=99.5)  # 0.5 s before the scan: the tombstone must be there
    young.scan([], t=100.0, end=2)
    report = verdict(young)
    assert report["forbidden"] == [LOST_LATEST]
    assert "delete" in report["examples"][LOST_LATEST][0]["why"]
    old = History()
    old.send("a", 0, t=1.0)
    old.send("a", 1, delete=True, t=2.0)
    old.scan([], t=100.0, end=2)
    assert verdict(old)["valid"]


def test_an_old_value_standing_after_its_delete_is_resurrected():
    h = History()
    a0 = h.send("a", 0, t=1.0)
    h.send("a", 1, delete=True, t=2.0)
    h.scan([(0, "a", a0)], t=100.0, end=2)  # the tombstone cleaned away, the value it deleted not
    report = verdict(h)
    assert report["forbidden"] == [RESURRECTED]
    assert report["counts"][RESURRECTED] == 1


def test_the_delete_kept_beside_the_old_value_is_valid():
    h = History()
    a0 = h.send("a", 0, t=1.0)
    h.send("a", 1, delete=True, t=2.0)
    h.scan([(0, "a", a0), (1, "a", None)], t=100.0)
    assert verdict(h)["valid"]


@pytest.mark.parametrize("reads, what", [
    ([(0, "a", "w-0"), (0, "a", "w-0"), (1, "b", "w-1")], "repeated offset"),
    ([(1, "b", "w-1"), (0, "a", "w-0")], "offset went back"),
    ([(0, "a", "w-0"), (2, "b", "w-1")], "read at another offset than acknowledged"),
])
def test_offsets_repeated_going_back_or_changed_are_offset_anomalies(reads, what):
    h = History()
    h.send("a", 0)
    h.send("b", 1)
    h.scan(reads, end=3)
    report = verdict(h)
    assert OFFSET_ANOMALY in report["forbidden"]
    assert what in [e["what"] for e in report["examples"][OFFSET_ANOMALY]]


def test_a_keys_records_out_of_write_order_are_an_offset_anomaly():
    h = History()
    first = h.send("a", outcome="unknown")
    second = h.send("a", outcome="unknown")
    h.scan([(0, "a", second), (1, "a", first)])
    report = verdict(h)
    assert report["forbidden"] == [OFFSET_ANOMALY]
    assert report["examples"][OFFSET_ANOMALY][0]["what"] == "a key's records out of write order"


def test_acknowledgements_out_of_send_order_are_an_offset_anomaly():
    h = History()
    a = h.send("a", 1)
    b = h.send("b", 0)
    h.scan([(0, "b", b), (1, "a", a)])
    assert verdict(h)["forbidden"] == [OFFSET_ANOMALY]


def test_a_removed_record_that_comes_back_is_found():
    h = History()
    h.send("a", 0)
    a1 = h.send("a", 1)
    h.send("b", 2)
    b3 = h.send("b", 3)
    h.scan([(1, "a", a1), (3, "b", b3)], t=10.0, final=False, end=4)  # offset 0 cleaned away
    h.scan([(0, "a", "w-0"), (1, "a", a1), (3, "b", b3)], t=100.0, end=4)  # and back
    report = verdict(h)
    assert report["forbidden"] == [RECORD_BACK]
    assert report["examples"][RECORD_BACK][0]["offset"] == 0


def test_a_record_no_write_made_or_a_failed_write_is_unexpected():
    h = History()
    a0 = h.send("a", 0)
    failed = h.send("a", outcome="failed")
    h.scan([(0, "a", a0), (1, "a", failed), (2, "a", "nobody-wrote-this")])
    report = verdict(h)
    assert report["forbidden"] == [UNEXPECTED_RECORD]
    assert report["counts"][UNEXPECTED_RECORD] == 2


def test_a_final_scan_that_did_not_reach_the_end_is_invalid():
    h = History()
    a0 = h.send("a", 0)
    h.send("b", 1)
    h.scan([(0, "a", a0)], end=1, complete=False)
    report = verdict(h)
    assert report["forbidden"] == [FINAL_INCOMPLETE]  # b is not called lost: nothing could be checked there
