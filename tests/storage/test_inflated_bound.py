"""The bound on a wrapper's inflated size (``max_inflated_bytes``): refused at
append and by the consumer's decoder before inflating past it, with memory
bounded; the accelerated and the pure-Python paths alike."""

from __future__ import annotations

import tracemalloc

import pytest

from raylog.config import TopicConfig
from raylog.errors import ConfigError, InflatedSizeTooLargeError, MessageTooLargeError
from raylog.storage.compression import CODEC_GZIP, CODEC_LZ4, CODEC_ZSTD, compress
from raylog.storage.log import PartitionLog
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message, encode_message_set
from raylog.storage.validation import validate_message_set

MiB = 1 << 20


def bomb(codec: int, inflated_bytes: int) -> bytes:
    message = encode_message(b"0123456789", timestamp_ms=1)
    inner = message * (inflated_bytes // len(message))
    return encode_message(compress(codec, inner), timestamp_ms=1, codec=codec)


@pytest.fixture(scope="module")
def bombs():
    return {codec: bomb(codec, 64 * MiB) for codec in (CODEC_GZIP, CODEC_ZSTD, CODEC_LZ4)}


def test_default_limit_is_eight_times_max_message_bytes():
    assert TopicConfig().max_inflated_limit == 8 * MiB
    assert TopicConfig(max_message_bytes=2 * MiB, segment_bytes=8 * MiB).max_inflated_limit == 16 * MiB
    assert TopicConfig(max_inflated_bytes=3 * MiB).max_inflated_limit == 3 * MiB
    with pytest.raises(ConfigError):
        TopicConfig(max_inflated_bytes=1000)  # below max_message_bytes


@pytest.mark.parametrize("codec", [CODEC_GZIP, CODEC_ZSTD, CODEC_LZ4], ids=["gzip", "zstd", "lz4"])
def test_a_bomb_is_refused_by_the_consumer_decoder_with_memory_bounded(bombs, codec):
    wrapper = bombs[codec]
    assert len(wrapper) < 400 << 10
    tracemalloc.start()
    try:
        with pytest.raises(InflatedSizeTooLargeError) as info:
            decode_messages(wrapper, 0, max_inflated_bytes=4 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.limit == 4 * MiB and isinstance(info.value, MessageTooLargeError)
    assert peak < 12 * MiB  # never near the 64 MiB the wrapper inflates to


def test_the_consumer_decoder_defaults_to_the_topic_default(bombs):
    with pytest.raises(InflatedSizeTooLargeError):
        decode_messages(bombs[CODEC_ZSTD], 0)
    small = encode_message_set([b"x" * 100] * 1000, compression="zstd")
    records, _ = decode_messages(small, 0)
    assert len(records) == 1000


def test_a_bomb_is_refused_at_append_and_the_log_keeps_what_it_had(tmp_path, bombs):
    with PartitionLog(tmp_path / "p", TopicConfig(flush_ms=10**6)) as plog:
        plog.append(encode_message_set([b"kept"]))
        end = plog.log_end_offset
        for wrapper in bombs.values():
            with pytest.raises(InflatedSizeTooLargeError):
                plog.append(wrapper)
        with pytest.raises(InflatedSizeTooLargeError):
            validate_message_set(bombs[CODEC_GZIP], max_inflated_bytes=2 * MiB)
        assert plog.log_end_offset == end
        plog.append(encode_message_set([b"after"], compression="gzip"))
        assert plog.log_end_offset > end


def test_a_topic_may_raise_its_limit(tmp_path):
    wrapper = bomb(CODEC_ZSTD, 12 * MiB)
    with PartitionLog(tmp_path / "p", TopicConfig(max_inflated_bytes=16 * MiB, flush_ms=10**6)) as plog:
        plog.append(wrapper)
