"""The partition directory's lock (raylog.storage.fileops.lock_directory):
refused at once by default, waited for within a bound when asked."""

import multiprocessing
import time

import pytest

from raylog.errors import LogDirectoryLockedError
from raylog.storage.log import PartitionLog


def _hold_lock(directory: str, ready, hold_s: float) -> None:
    log = PartitionLog(directory)
    ready.set()
    time.sleep(hold_s)
    log.close()


def _holder(directory, hold_s):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(directory, ready, hold_s))
    proc.start()
    assert ready.wait(60), "the holder did not open the log"
    return proc


def test_a_lock_released_within_the_wait_is_taken(tmp_path):
    """A partition actor Ray starts again while the process before it still
    leaves in order: it opens the log once that process lets go."""
    directory = str(tmp_path / "p")
    holder = _holder(directory, 1.0)
    try:
        with pytest.raises(LogDirectoryLockedError, match="locked by another owner"):
            PartitionLog(directory)
        with PartitionLog(directory, lock_wait_s=30) as log:
            assert log.log_end_offset == 0
    finally:
        holder.join(30)


def test_a_lock_held_past_the_wait_is_refused_naming_the_wait(tmp_path):
    directory = str(tmp_path / "p")
    holder = _holder(directory, 5.0)
    try:
        started = time.monotonic()
        with pytest.raises(LogDirectoryLockedError, match="after waiting 0.5 s"):
            PartitionLog(directory, lock_wait_s=0.5)
        assert time.monotonic() - started < 4.0
    finally:
        holder.join(30)
