"""The recorder: one JSON line per operation, written as it happens, so a
killed process leaves every completed operation behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from raylog.testing.history import Recorder, by_process, history_files, read_history


def test_recorder_survives_sigkill(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal
        from raylog.testing.history import Recorder
        r = Recorder({str(tmp_path / "c.jsonl")!r}, "consumer-0.1")
        for i in range(100):
            r.record("poll", reads=[["t", 0, i, f"v{{i}}"]], error=None)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == -9
    ops = read_history(history_files(str(tmp_path)))
    assert [op["seq"] for op in ops] == list(range(100))
    assert ops[-1]["reads"] == [["t", 0, 99, "v99"]]


def test_a_cut_last_line_is_skipped_and_processes_keep_their_order(tmp_path):
    a = Recorder(str(tmp_path / "a.jsonl"), "a")
    b = Recorder(str(tmp_path / "b.jsonl"), "b")
    for i in range(3):
        a.record("start" if i == 0 else "stop")
        b.record("fault", kind="kill-partition", target="t/0", detail={})
    a.close()
    b.close()
    with open(tmp_path / "b.jsonl", "ab") as f:
        f.write(b'{"process":"b","seq":3,"ty')  # killed in the middle of a write
    ops = read_history(history_files(str(tmp_path)))
    grouped = by_process(reversed(ops))
    assert [op["seq"] for op in grouped["a"]] == [0, 1, 2]
    assert [op["seq"] for op in grouped["b"]] == [0, 1, 2]
    assert all(op["t0"] <= op["t1"] for op in ops)
    assert not os.path.exists(tmp_path / "damaged.lines")
