"""A full disk: DiskFullError (retriable, naming node and path), nothing
half written, reads go on, writes resume by themselves when space returns.
One test injects ENOSPC at the file layer; the others fill a real tmpfs."""

import contextlib
import errno
import os
import subprocess
import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import DiskFullError, StorageError
from raylog.storage import fileops
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set

from conftest import read_all

CONFIG = TopicConfig(segment_bytes=256 * 1024, max_message_bytes=16 * 1024, flush_messages=1_000_000,
                     flush_ms=60_000)


def one(i: int, size: int = 1000) -> bytes:
    return encode_message_set([(b"%06d" % i) * (size // 6)], timestamp_ms=1000 + i)


@contextlib.contextmanager
def small_tmpfs(path, size="1m"):
    """A tmpfs of ``size`` mounted at ``path`` (root only), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_enospc_at_the_file_layer_is_disk_full_not_a_disk_error(tmp_path, monkeypatch):
    errors = []
    log = PartitionLog(tmp_path / "p", CONFIG, on_disk_error=errors.append, node="node-7")
    first = log.append(one(0))
    real_write = os.write

    def full(fd, data):
        if fd == log._active.fd:  # noqa: SLF001 - the segment's writes only
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(DiskFullError) as err:
        log.append(one(1))
    assert err.value.retriable and isinstance(err.value, StorageError)
    assert err.value.node == "node-7" and err.value.path.endswith(".log") and "disk full on node node-7" in str(err.value)
    assert log.disk_full and errors == []  # no disk error: the owner is not told to restart
    from raylog.metrics import PartitionMetrics

    metrics = PartitionMetrics("c", "t", 0, log)
    metrics.sample(log, {})
    assert metrics.snapshot()["disk_full"] == 1  # raylog_partition_disk_full
    with pytest.raises(DiskFullError):  # refused at once while full
        log.append(one(2))
    log.flush()
    assert [r[3][:6] for r in read_all(log)] == [b"000000"]  # reads go on; nothing half written
    monkeypatch.setattr(os, "write", real_write)
    monkeypatch.setattr(fileops, "DISK_FULL_RETRY_S", 0.0)
    assert log.maybe_resume()  # room again
    assert not log.disk_full
    log.append(one(3))
    log.flush()
    assert [r[3][:6] for r in read_all(log)] == [b"000000", b"000003"] and first == 0
    log.close()


def _fill(log, start: int):
    accepted, i = [], start
    while True:
        try:
            log.append(one(i))
        except DiskFullError as err:
            return accepted, err
        accepted.append(i)
        i += 1
        assert i < start + 10_000, "the tmpfs never filled"


def test_a_real_full_tmpfs_keeps_accepted_data_and_resumes_when_space_is_freed(tmp_path):
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        filler = os.path.join(disk, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * 300_000)
        log = PartitionLog(os.path.join(disk, "p"), CONFIG)
        try:
            accepted, err = _fill(log, 0)
            assert accepted and err.path.startswith(str(disk))
            assert log.disk_full
            log.flush()
            assert [int(r[3][:6]) for r in read_all(log)] == accepted  # every accepted message, intact
            with pytest.raises(DiskFullError):
                log.append(one(99_999))
            assert not log.maybe_resume()  # still full
            os.unlink(filler)
            assert log.maybe_resume()
            more = [log.append(one(50_000 + k)) for k in range(5)]
            log.flush()
            assert len(more) == 5
            assert [int(r[3][:6]) for r in read_all(log)] == accepted + [50_000 + k for k in range(5)]
        finally:
            log.close()
        # and it reopens clean: nothing torn, nothing reported
        with PartitionLog(os.path.join(disk, "p"), CONFIG) as again:
            assert again.recovery_reports == []
            assert len(read_all(again)) == len(accepted) + 5


def test_a_full_tmpfs_with_idempotent_producers_keeps_the_journal_aligned(tmp_path):
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        log = PartitionLog(os.path.join(disk, "p"), CONFIG)
        stored, sequence = [], 0
        try:
            while True:
                data = one(sequence)
                try:
                    log.append_sequenced(data, 42, 0, sequence, [len(data)])
                except DiskFullError:
                    break
                stored.append(sequence)
                sequence += 1
            log.flush()
        finally:
            log.close()
        with PartitionLog(os.path.join(disk, "p"), CONFIG) as again:
            assert again.recovery_reports == []
            assert [int(r[3][:6]) for r in read_all(again)] == stored
            # the producer state survived: the last stored set is a duplicate, the next one new
            last = one(stored[-1])
            assert again.append_sequenced(last, 42, 0, stored[-1], [len(last)]) < again.log_end_offset


def test_a_read_only_directory_is_one_clear_error(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    directory = tmp_path / "p"
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(directory)], check=True)
    try:
        with pytest.raises(StorageError) as err:
            PartitionLog(directory, CONFIG)
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)
    assert not isinstance(err.value, DiskFullError)
    assert "is not writable" in str(err.value) and "read-only mount" in str(err.value)
    assert err.value.read_only and err.value.directory == str(directory)
    assert err.value.__cause__ is None and err.value.__suppress_context__  # one error, no chained traceback


def test_a_disk_that_fills_during_a_cleaning_pass_stops_the_pass_and_the_log_serves_on(tmp_path):
    """The cleaner meets a full disk while it writes a cleaned segment: the
    pass stops there (the groups swapped before stay swapped), no
    ``.cleaned`` file is left, the log is not failed (its owner is not told
    to restart), the latest record of every key is read at its offset as
    before, and once room is back writes go on and the next pass cleans
    (docs/design.md section 3)."""
    from test_cleaner import latest, read_all as read_records

    from raylog.storage.record_batch import encode_batch
    from raylog.testing.faults import fill_disk, free_disk

    config = TopicConfig(cleanup_policy="compact", segment_bytes=64 * 1024, max_message_bytes=16 * 1024,
                         flush_messages=1, flush_ms=10**9, min_cleanable_dirty_ratio=0.01)
    with small_tmpfs(tmp_path / "mnt", size="2m") as mnt:
        errors = []
        log = PartitionLog(mnt / "p", config, on_disk_error=errors.append, node="node-3")
        try:
            for n in range(60):  # 60 batches over 8 keys, ~6 KiB each: several closed segments
                log.append(encode_batch([b"v-%d-" % n + b"x" * 1500] * 4,
                                        keys=[b"key-%d" % ((n * 4 + i) % 8) for i in range(4)], timestamp_ms=1000))
            log.flush()
            before = latest(read_records(log))
            fill_disk(str(mnt), leave_bytes=8 * 1024)  # less than one cleaned segment
            assert log.clean(now_ms=10**13, force=True) is None
            assert not [n for n in os.listdir(mnt / "p") if n.endswith(".cleaned")]
            assert errors == []  # not a disk error: the owner is not told to restart
            assert latest(read_records(log)) == before
            free_disk(str(mnt))
            log.append(encode_batch([b"after"], keys=[b"key-0"], timestamp_ms=1000))  # writes go on
            log.flush()
            result = log.clean(now_ms=10**13, force=True)
            assert result is not None and result.records_removed > 0
            assert errors == []
            after = latest(read_records(log))
            assert after[b"key-0"][1] == b"after" and {k: v for k, v in after.items() if k != b"key-0"} == {
                k: v for k, v in before.items() if k != b"key-0"}
        finally:
            free_disk(str(mnt))
            log.close()
