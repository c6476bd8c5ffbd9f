"""The format file of a partition directory: versions checked on open; an unknown one refused, nothing cut."""

import hashlib
import os

import pytest

import raylog
from raylog.config import TopicConfig
from raylog.errors import StorageFormatError
from raylog.storage import format_file
from raylog.storage.format_file import CURRENT, FILE_NAME, READS, Formats
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set

from conftest import read_all

CONFIG = TopicConfig(segment_bytes=4096, max_message_bytes=2048, flush_messages=1_000_000, flush_ms=60_000)


def msgs(*values):
    return encode_message_set([v.encode() for v in values], timestamp_ms=1)


def values(log):
    return [r[3].decode() for r in read_all(log)]


def snapshot(directory):
    """Every file of the directory (but the lock) and a hash of its bytes."""
    return {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        for name in sorted(os.listdir(directory))
        if name != "lock"
    }


def write_partition(directory):
    """A partition with flushed data, unflushed data and an idempotent producer."""
    log = PartitionLog(directory, CONFIG)
    log.append(msgs("a", "b"))
    log.append_sequenced(msgs("c"), 7, 0, 0, [len(msgs("c"))])
    log.flush()
    log.append(msgs("d"))
    log.close()


def test_a_new_directory_gets_the_current_versions(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        log.append(msgs("a"))
    data = (tmp_path / FILE_NAME).read_bytes()
    assert len(data) == format_file.SIZE and data[:4] == b"RLFM"
    assert format_file.decode(data, "x") == CURRENT


def test_a_directory_without_a_format_file_is_version_1_and_stays_readable(tmp_path):
    write_partition(tmp_path)
    os.unlink(tmp_path / FILE_NAME)  # as written before the format file existed
    before = snapshot(tmp_path)
    with PartitionLog(tmp_path, CONFIG) as log:
        assert values(log) == ["a", "b", "c", "d"]
        assert log.recovery_reports == []
    assert format_file.decode((tmp_path / FILE_NAME).read_bytes(), "x") == Formats(1, 1, 1, 1)
    after = snapshot(tmp_path)
    del after[FILE_NAME]
    assert after == before  # only the format file was added


@pytest.mark.parametrize("kind", Formats._fields)
def test_a_newer_version_of_any_file_kind_is_refused_and_nothing_is_touched(tmp_path, kind):
    write_partition(tmp_path)
    newer = READS._replace(**{kind: getattr(READS, kind) + 1})
    format_file.write(str(tmp_path), newer)
    # what a newer producer-state journal might hold: a record this code
    # reads as damage (it would cut it as a torn tail)
    with open(tmp_path / "producer-state", "ab") as f:
        f.write(b"\x02" + os.urandom(40))
    before = snapshot(tmp_path)
    with pytest.raises(StorageFormatError) as info:
        PartitionLog(tmp_path, CONFIG)
    err = info.value
    path = str(tmp_path / FILE_NAME)
    assert path in str(err) and kind in str(err)
    assert f"{kind} version {getattr(newer, kind)}" in str(err)
    assert err.path == path and err.found[kind] == getattr(newer, kind)
    assert err.known == READS._asdict()
    assert isinstance(err, raylog.RaylogError) and not err.retriable
    assert snapshot(tmp_path) == before  # nothing truncated, rewritten or created
    # the directory's lock was let go: with the known version back, it opens whole
    format_file.write(str(tmp_path), CURRENT)
    with open(tmp_path / "producer-state", "r+b") as f:
        f.truncate(os.path.getsize(tmp_path / "producer-state") - 41)
    with PartitionLog(tmp_path, CONFIG) as log:
        assert values(log) == ["a", "b", "c", "d"]
        assert log.recovery_reports == []


def test_a_newer_layout_of_the_format_file_is_refused(tmp_path):
    write_partition(tmp_path)
    data = bytearray((tmp_path / FILE_NAME).read_bytes())
    data[4] = 2
    (tmp_path / FILE_NAME).write_bytes(bytes(data) + b"more fields")
    before = snapshot(tmp_path)
    with pytest.raises(StorageFormatError, match="layout version 2"):
        PartitionLog(tmp_path, CONFIG)
    assert snapshot(tmp_path) == before


def test_a_damaged_format_file_is_refused_not_guessed(tmp_path):
    write_partition(tmp_path)
    data = bytearray((tmp_path / FILE_NAME).read_bytes())
    data[6] ^= 0x40
    (tmp_path / FILE_NAME).write_bytes(bytes(data))
    before = snapshot(tmp_path)
    with pytest.raises(StorageFormatError, match="damaged") as info:
        PartitionLog(tmp_path, CONFIG)
    assert str(tmp_path / FILE_NAME) in str(info.value)
    assert snapshot(tmp_path) == before
