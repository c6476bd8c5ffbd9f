"""COUNT (raylog.storage.counting.count_records, COUNT version 1) on a log the
cleaner rewrote: from any offset a reader may start at (a kept record's,
one the cleaner removed, the log start in a gap), with any bound on bytes
and messages, stepping on at each answer's ``next_offset``, the counts add
up to exactly the records a reader from there gets."""

from __future__ import annotations

import pytest

from raylog.storage.counting import count_records
from raylog.storage.log import PartitionLog

from test_cleaner import CONFIG, NOW, fill, read_all


@pytest.fixture
def cleaned_log(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    written = fill(log, rounds=20, keys=16, per_batch=4, tombstone_every=7)
    assert log.clean(now_ms=NOW - 10**9) is not None  # tombstones kept (delete_retention_ms not passed)
    yield log, written
    log.close()


def _count_from(log, start: int, max_bytes: int, max_messages: int) -> int:
    total, pos, steps = 0, start, 0
    while pos < log.high_watermark:
        counted = count_records(log, pos, log.high_watermark, max_bytes, max_messages)
        assert counted.next_offset > pos, f"no progress at {pos}"
        total, pos, steps = total + counted.messages, counted.next_offset, steps + 1
        assert steps < 10_000
    return total


@pytest.mark.parametrize("max_bytes,max_messages", [(1 << 20, -1), (1 << 20, 3), (100, -1), (1, 1), (1, 5)])
def test_count_from_any_offset_equals_what_a_reader_gets(cleaned_log, max_bytes, max_messages):
    log, written = cleaned_log
    kept = {offset for offset, _key, _value in read_all(log)}
    assert len(kept) < len(written)  # the cleaner removed records: there are gaps
    assert log.log_start_offset not in kept  # the log starts in a gap
    for offset, _key, _value in written:
        assert _count_from(log, offset, max_bytes, max_messages) == len(read_all(log, offset)), offset
