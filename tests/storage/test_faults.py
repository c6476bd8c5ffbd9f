"""Disk errors in every writing path of the log (fsync, roll, retention,
append) reach the owner's ``on_disk_error`` hook and leave the log refusing
writes, so that the owner restarts and recovers it; the fault-injection
switch fires once per armed point."""

from __future__ import annotations

import os

import pytest

from raylog.config import TopicConfig
from raylog.errors import StorageError
from raylog.storage import faults
from raylog.storage import log as log_module
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set

from conftest import read_all

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9, segment_bytes=1024, max_message_bytes=1024, retention_ms=0)


@pytest.fixture
def injected(monkeypatch):
    monkeypatch.setattr(log_module._faults, "check", faults._check_files)


def open_log(tmp_path, errors: list) -> PartitionLog:
    return PartitionLog(tmp_path / "p", CONFIG, on_disk_error=errors.append)


def fill(plog, n=6):
    for i in range(n):
        plog.append(encode_message_set([b"%03d" % i + b"." * 300], timestamp_ms=1))


def test_a_failed_fsync_calls_the_hook_and_the_log_refuses_writes(tmp_path, injected):
    errors: list = []
    plog = open_log(tmp_path, errors)
    fill(plog, 2)
    plog.flush()
    faults.arm(plog.directory, "fsync")
    fill(plog, 1)
    with pytest.raises(StorageError):
        plog.flush()
    assert len(errors) == 1 and isinstance(errors[0], OSError)
    with pytest.raises(StorageError, match="disk error"):
        fill(plog, 1)
    plog.close()
    with PartitionLog(tmp_path / "p", CONFIG) as again:  # reopening recovers; the fault fired once
        fill(again, 1)
        again.flush()
        assert len(read_all(again)) == 4


def test_a_failed_roll_calls_the_hook(tmp_path, injected):
    errors: list = []
    plog = open_log(tmp_path, errors)
    fill(plog, 2)
    faults.arm(plog.directory, "roll")
    with pytest.raises(StorageError, match="cannot roll"):
        fill(plog, 4)
    assert len(errors) == 1
    plog.close()


def test_a_failed_retention_delete_calls_the_hook(tmp_path, injected):
    errors: list = []
    plog = open_log(tmp_path, errors)
    fill(plog, 8)
    plog.flush()
    faults.arm(plog.directory, "retention")
    with pytest.raises(StorageError, match="cannot delete old segments"):
        plog.delete_old_segments(now_ms=10**15)
    assert len(errors) == 1
    plog.close()


def test_a_failed_append_calls_the_hook_and_nothing_half_written_stays(tmp_path, monkeypatch):
    errors: list = []
    plog = open_log(tmp_path, errors)
    fill(plog, 1)
    end = plog.log_end_offset

    def failing_write(fd, data):
        raise OSError(5, "Input/output error")  # (a full disk is not a disk error: test_disk_full.py)

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(StorageError, match="cannot append"):
        fill(plog, 1)
    monkeypatch.undo()
    assert len(errors) == 1 and plog.log_end_offset == end
    plog.close()


def test_without_the_switch_armed_files_are_ignored(tmp_path):
    if faults.enabled():
        pytest.skip(f"{faults.ENV} is set in this process")
    errors: list = []
    plog = open_log(tmp_path, errors)
    fill(plog, 1)
    faults.arm(plog.directory, "fsync")
    assert plog.flush() and errors == []  # the switch is off in this process
    plog.close()
