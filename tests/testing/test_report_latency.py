"""The report's latency line: a message read within a millisecond of its
send (different processes' clocks: a hair below zero) shows as 0.000 s,
never -0.000 s."""

from __future__ import annotations

from raylog.testing.checker import check
from raylog.testing.report import table


def _ops(read_after_s: float):
    ops = []
    for i in range(5):
        ops.append({"process": "p", "seq": i, "type": "send", "t0": 100.0 + i, "t1": 100.0 + i,
                    "topic": "t", "value": f"v{i}", "key": None, "acks": "all", "codec": None,
                    "outcome": "ok", "partition": 0, "offset": 30 * i, "error": None})
        ops.append({"process": "c", "seq": i, "type": "poll", "t0": 100.0 + i, "t1": 100.0 + i + read_after_s,
                    "reads": [["t", 0, 30 * i, f"v{i}"]], "error": None})
    return ops


def _latency_line(ops) -> str:
    (line,) = [line for line in table(check(ops)).splitlines() if line.startswith("send->read latency")]
    return line


def test_a_latency_a_hair_below_zero_prints_as_zero():
    report = check(_ops(-0.0002))
    assert report["latency_s"]["p50"] < 0  # what the clocks measured
    line = _latency_line(_ops(-0.0002))
    assert "-0.000" not in line and "p50 0.000 s" in line, line


def test_a_real_latency_prints_as_measured():
    assert "p50 0.250 s" in _latency_line(_ops(0.25))
