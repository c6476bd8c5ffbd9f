"""PartitionLog.reconfigure (a live topic's changed config) and
PartitionLog.dirty_ratio, on a real log in a temporary directory."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import MissingKeyError
from raylog.storage.cleaner_thread import CleanerThread
from raylog.storage.log import PartitionLog
from raylog.storage.record_batch import encode_batch

DELETE = TopicConfig(flush_messages=1, flush_ms=10**9, segment_bytes=512, max_message_bytes=512,
                     retention_ms=10**12)
NOW = 10**13  # every segment is old by then


def fill(log, rounds=6, keys=8):
    for r in range(rounds):
        log.append(encode_batch([b"value-%d-%d" % (r, k) for k in range(keys)],
                                keys=[b"key-%d" % k for k in range(keys)], timestamp_ms=1000))
    log.flush()


@pytest.fixture
def plog(tmp_path):
    log = PartitionLog(tmp_path / "p", DELETE)
    yield log
    if not log.closed:
        log.close()


def test_a_delete_log_turned_compact_refuses_records_without_a_key_and_keeps_what_it_had(plog):
    plog.append(encode_batch([b"no key"], keys=[None], timestamp_ms=1000))  # fine under delete
    plog.flush()
    end = plog.log_end_offset
    plog.reconfigure(DELETE.replace(cleanup_policy="compact"))
    with pytest.raises(MissingKeyError):
        plog.append(encode_batch([b"no key either"], keys=[None], timestamp_ms=1000))
    assert plog.log_end_offset == end  # nothing of the refused set was stored
    assert plog.read(0, 1 << 16).tobytes()  # what it had is still read


def test_retention_follows_the_new_config(plog):
    import time

    fill(plog)
    soon = int(time.time() * 1000) + 60_000
    assert plog.delete_old_segments(soon) == []  # retention_ms far away (DELETE's)
    plog.reconfigure(DELETE.replace(retention_ms=1))
    assert plog.delete_old_segments(soon)  # old segments go now
    plog.reconfigure(DELETE.replace(retention_ms=1, cleanup_policy="compact"))
    fill(plog)
    assert plog.delete_old_segments(soon) == []  # compact alone deletes nothing


def test_settings_fixed_when_the_log_opened_are_kept(plog):
    plog.reconfigure(DELETE.replace(max_message_bytes=256, max_producer_ids=5, segment_bytes=1024))
    assert plog.config.max_message_bytes == 512 and plog.config.max_producer_ids == 10_000
    assert plog.config.segment_bytes == 1024


def test_the_dirty_ratio_is_none_until_compacted_then_falls_with_a_cleaning(plog):
    fill(plog)
    assert plog.dirty_ratio(NOW) is None
    plog.reconfigure(DELETE.replace(cleanup_policy="compact", min_compaction_lag_ms=0))
    assert plog.dirty_ratio(NOW) == 1.0  # nothing cleaned yet
    assert plog.clean(NOW) is not None
    assert plog.dirty_ratio(NOW) == 0.0


def test_the_cleaner_thread_counts_what_it_removed(plog):
    fill(plog)
    plog.reconfigure(DELETE.replace(cleanup_policy="compact", min_cleanable_dirty_ratio=0.01,
                                    retention_check_ms=20))
    cleaner = CleanerThread.for_log(plog)
    try:
        import time

        deadline = time.monotonic() + 30
        while cleaner.passes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        state = cleaner.state()
        assert state["running"] and state["passes"] >= 1
        assert state["bytes_removed"] > 0 and state["records_removed"] > 0 and state["last_run_ms"] > 0
    finally:
        cleaner.stop()
    assert not cleaner.running


def test_a_cleaner_that_cannot_clean_records_without_a_key_stops_visibly(plog):
    """A delete topic's records without a key, the topic turned compact:
    the cleaner (raylog.storage.cleaner) cannot map them; its thread stops
    and says why instead of dying unseen, and the log keeps every record."""
    import time

    for r in range(6):
        plog.append(encode_batch([b"v%d" % r] * 4, keys=[None, b"a", None, b"b"], timestamp_ms=1000))
    plog.flush()
    before = plog.read(0, 1 << 20).tobytes()
    plog.reconfigure(DELETE.replace(cleanup_policy="compact", min_cleanable_dirty_ratio=0.01, retention_check_ms=20))
    cleaner = CleanerThread.for_log(plog)
    try:
        deadline = time.monotonic() + 30
        while cleaner.failure is None and time.monotonic() < deadline:
            time.sleep(0.02)
        state = cleaner.state()
        assert not state["running"] and state["failure"] is not None
    finally:
        cleaner.stop()
    assert plog.read(0, 1 << 20).tobytes() == before
