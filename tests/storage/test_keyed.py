"""The key rule of a compacted topic (docs/design.md §3): a record without a
key is refused at append with :class:`MissingKeyError`, nothing of its set is
stored, and what the log accepted before and after stays readable -- in the
file log and the in-memory log, for format 1 and format 2, every codec."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import InvalidMessageError, MissingKeyError
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.memory import MemoryLog
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import decode_batch, encode_batch, format_at, iter_batches

from conftest import COMPRESSIONS

COMPACT = TopicConfig(cleanup_policy="compact", flush_messages=1)


@pytest.fixture(params=["file", "memory"])
def make_log(request, tmp_path):
    opened = []

    def make(config=COMPACT):
        log = PartitionLog(tmp_path / "p", config) if request.param == "file" else MemoryLog(config)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def _read_all(log) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record below the high watermark."""
    log.flush()
    data = log.read(log.log_start_offset, 1 << 24).tobytes()
    start = log.log_start_offset
    if format_at(data) == 2:  # (byte 16 alone is a format-1 message's timestamp: 2 once in 256 ms)
        return [(r.offset, r.key, r.value) for pos, _h in iter_batches(data)
                for r in decode_batch(data, pos).records]
    records, _ = decode_messages(data, start)
    return [(offset, key, value) for offset, _ts, key, value in records]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_a_keyless_batch_record_is_refused_and_accepted_data_is_intact(make_log, compression):
    log = make_log()
    first = log.append(encode_batch([b"v1", b"v2"], keys=[b"a", b"b"], compression=compression))
    with pytest.raises(MissingKeyError) as caught:
        log.append(encode_batch([b"x", b"y", b"z"], keys=[b"k", None, b"m"], compression=compression))
    assert isinstance(caught.value, InvalidMessageError) and not caught.value.retriable
    assert "compact" in str(caught.value) and caught.value.offset == 1
    after = log.append(encode_batch([b"v3"], keys=[b"a"], compression=compression))
    assert [(k, v) for _o, k, v in _read_all(log)] == [(b"a", b"v1"), (b"b", b"v2"), (b"a", b"v3")]
    assert first == 0 and after > first


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_keyless_message_is_refused_and_accepted_data_is_intact(make_log, compression):
    log = make_log()
    log.append(encode_message_set([b"v1"], keys=[b"a"], compression=compression))
    with pytest.raises(MissingKeyError):
        log.append(encode_message_set([b"x", b"y"], keys=[b"k", None], compression=compression))
    with pytest.raises(MissingKeyError):
        log.append_sequenced(encode_message_set([b"x"]), 7, 0, 0, [1])
    log.append(encode_message_set([b"v2"], keys=[b"b"], compression=compression))
    assert [(k, v) for _o, k, v in _read_all(log)] == [(b"a", b"v1"), (b"b", b"v2")]


def test_a_tombstone_has_a_key_and_is_accepted(make_log):
    log = make_log()
    log.append(encode_batch([b"v1", None], keys=[b"a", b"a"]))
    assert [(k, v) for _o, k, v in _read_all(log)] == [(b"a", b"v1"), (b"a", None)]


@pytest.mark.parametrize("policy", ["delete", "compact,delete"])
def test_keyless_records_are_kept_unless_the_topic_is_compacted(make_log, policy):
    log = make_log(TopicConfig(cleanup_policy=policy, flush_messages=1))
    if policy == "delete":
        log.append(encode_batch([b"v1"]))
        assert [(k, v) for _o, k, v in _read_all(log)] == [(None, b"v1")]
    else:
        with pytest.raises(MissingKeyError):
            log.append(encode_batch([b"v1"]))


def test_a_compact_only_topic_keeps_old_segments(tmp_path):
    config = COMPACT.replace(segment_bytes=200, max_message_bytes=200, retention_ms=0)
    with PartitionLog(tmp_path / "p", config) as log:
        for i in range(5):
            log.append(encode_batch([b"x" * 100], keys=[b"k%d" % i]))
        log.flush()
        assert len(log.segment_bases) > 1
        assert log.delete_old_segments(now_ms=1 << 60) == []
    with PartitionLog(tmp_path / "q", config.replace(cleanup_policy="compact,delete")) as log:
        for i in range(5):
            log.append(encode_batch([b"x" * 100], keys=[b"k%d" % i]))
        log.flush()
        assert log.delete_old_segments(now_ms=1 << 60)
