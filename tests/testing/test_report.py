"""The report: table and per-second series without matplotlib; the PNG with it."""

from __future__ import annotations

import pytest

from raylog.testing.checker import check
from raylog.testing.report import per_second, table, timeline_png


def _ops():
    ops = []
    for i in range(10):
        ops.append({"process": "p", "seq": i, "type": "send", "t0": 100.0 + i * 0.3, "t1": 100.0 + i * 0.3,
                    "topic": "t", "value": f"v{i}", "key": None, "acks": "all", "codec": None,
                    "outcome": "ok", "partition": 0, "offset": 30 * i, "error": None})
    ops.append({"process": "c", "seq": 0, "type": "poll", "t0": 101.0, "t1": 101.5,
                "reads": [["t", 0, 30 * i, f"v{i}"] for i in range(10)], "error": None})
    ops.append({"process": "nemesis", "seq": 0, "type": "fault", "t0": 100.5, "t1": 101.2,
                "kind": "kill-partition", "target": "t/0", "detail": {}})
    return ops


def test_per_second_counts_and_faults():
    series = per_second(_ops())
    assert sum(series["produced"]) == 10 and sum(series["consumed"]) == 10
    assert series["consumed"][1] == 10
    assert series["faults"] == [(0.5, pytest.approx(1.2), "kill-partition")]


def test_table_names_every_anomaly_and_the_verdict():
    text = table(check(_ops()))
    assert text.startswith("verdict            VALID")
    for name in ("lost-write", "unseen", "duplicate", "inconsistent-offsets", "nonmonotonic-poll", "poll-skip"):
        assert name in text
    assert "kill-partition 1" in text


def test_the_txn_table_names_every_txn_anomaly_and_the_verdict():
    from raylog.testing.txn_checker import ANOMALIES, check as check_txn

    ops = [
        {"process": "w", "seq": 0, "type": "txn", "t0": 1.0, "t1": 1.0, "phase": "begin", "txn": "w-t0",
         "intent": "abort", "partitions": [0], "offsets": None, "kill": False},
        {"process": "w", "seq": 1, "type": "send", "t0": 1.0, "t1": 1.1, "topic": "txn", "txn": "w-t0",
         "value": "w-t0-0", "outcome": "ok", "partition": 0, "offset": 0},
        {"process": "w", "seq": 2, "type": "txn", "t0": 1.0, "t1": 1.2, "phase": "end", "txn": "w-t0",
         "intent": "abort", "outcome": "aborted", "values": ["w-t0-0"], "offsets": None, "error": None},
        {"process": "reader-read-committed", "seq": 0, "type": "poll", "t0": 2.0, "t1": 2.0,
         "reads": [["txn", 0, 0, "w-t0-0"]], "error": None},
        {"process": "final-reader", "seq": 0, "type": "final", "t0": 3.0, "t1": 3.0, "what": "read",
         "partition": 0, "hw": 40, "lso": 40, "position": 40, "reads": [], "complete": True},
    ]
    text = table(check_txn(ops))
    assert text.startswith("verdict            INVALID: aborted-read")
    for name in ANOMALIES:
        assert name in text
    assert "aborted-read         1" in text
    assert "transactions       1  committed 0  aborted 1" in text


def test_timeline_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = timeline_png(_ops(), str(tmp_path / "t.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
