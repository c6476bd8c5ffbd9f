"""The hosts kit's venv cache: a prune keeps the most recently used entries
and every entry another live process holds, whatever its age (a cluster of
another checkout may still run from it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from raylog.testing import hosts as kit

HOLDER = """
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(120)
"""


def _entry(cache, name: str, age_s: float) -> str:
    path = cache / name
    (path / "venv").mkdir(parents=True)
    (path / "ready").touch()
    (path / "in-use").touch()
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return str(path)


def test_a_prune_keeps_the_newest_and_every_entry_another_process_holds(tmp_path):
    cache = tmp_path / "cache"
    held = _entry(cache, "old-held", 500)
    for i, age in enumerate((400, 300, 20, 10)):
        _entry(cache, f"e{i}", age)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, os.path.join(held, "in-use")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        kit._prune(str(cache), keep=2)
        assert sorted(os.listdir(cache)) == ["e2", "e3", "old-held"]
    finally:
        holder.kill()
        holder.wait()
    kit._prune(str(cache), keep=2)  # no one holds it now
    assert sorted(os.listdir(cache)) == ["e2", "e3"]
