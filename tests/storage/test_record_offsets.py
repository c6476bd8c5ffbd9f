"""One record offset per message (docs/design.md §2): inner message i of a
wrapper at w reports w + i; wrappers are padded to at least their count;
old (unpadded) wrappers clamp; a read inside a wrapper names its start."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import InvalidOffsetError
from raylog.storage.compression import compress
from raylog.storage.counting import count_message_set
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.memory import MemoryLog
from raylog.storage.message import CODEC_ZSTD, encode_message, encode_message_set, inner_offset
from raylog.storage.validation import validate_message_set

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9)
CODECS = ["gzip", "zstd", "lz4"]


@pytest.mark.parametrize("codec", CODECS)
def test_a_set_of_many_empty_messages_is_padded_to_its_count(codec):
    count = 5000
    buf = encode_message_set([b""] * count, timestamp_ms=7, compression=codec)
    assert len(buf) >= count  # the compressed bytes alone are far fewer
    assert validate_message_set(buf) == 1
    assert count_message_set(buf, 1 << 20)[:2] == (len(buf), count)
    records, consumed = decode_messages(buf, 1000)
    assert consumed == len(buf)
    assert [r[0] for r in records] == list(range(1000, 1000 + count))
    assert all(r[3] == b"" and r[2] is None for r in records)


@pytest.mark.parametrize("codec", CODECS)
def test_inner_messages_have_growing_offsets_of_their_own(codec):
    a = encode_message_set([b"plain"], timestamp_ms=1)
    b = encode_message_set([b"m%d" % i for i in range(100)], keys=[b"k"] * 100, timestamp_ms=2, compression=codec)
    c = encode_message_set([b"after"], timestamp_ms=3)
    records, _ = decode_messages(a + b + c, 0)
    offsets = [r[0] for r in records]
    w = len(a)
    assert offsets == [0] + list(range(w, w + 100)) + [w + len(b)]
    assert [r[3] for r in records] == [b"plain"] + [b"m%d" % i for i in range(100)] + [b"after"]


def test_an_old_wrapper_shorter_than_its_count_clamps_its_offsets():
    inner = encode_message_set([b""] * 200, timestamp_ms=5)
    old = encode_message(compress(CODEC_ZSTD, inner), None, 5, CODEC_ZSTD)  # written before the padding
    assert len(old) < 200
    nxt = encode_message_set([b"next"], timestamp_ms=6)
    records, consumed = decode_messages(old + nxt, 100)
    assert consumed == len(old) + len(nxt)
    offsets = [r[0] for r in records]
    end = 100 + len(old)
    assert offsets[:-1] == [inner_offset(100, end, i) for i in range(200)]
    assert offsets[:-1] == sorted(offsets[:-1]) and max(offsets[:-1]) == end - 1  # never the next message's
    assert offsets[-1] == end and records[-1][3] == b"next"


@pytest.fixture(params=["file", "memory"])
def log(request, tmp_path):
    made = PartitionLog(tmp_path / "p", CONFIG) if request.param == "file" else MemoryLog(CONFIG)
    yield made
    made.close()


def test_a_read_inside_a_wrapper_names_the_wrapper_and_others_stay_errors(log):
    plain = encode_message_set([b"v0", b"v1"], timestamp_ms=1)
    wrapped = encode_message_set([b"w%d" % i for i in range(30)], timestamp_ms=2, compression="zstd")
    log.append(plain)
    w = log.append(wrapped)
    log.append(encode_message_set([b"tail"], timestamp_ms=3))
    log.flush()
    with pytest.raises(InvalidOffsetError) as inside:
        log.read(w + 7, 1 << 20)
    assert inside.value.details["wrapper_offset"] == w
    assert inside.value.details["next_offset"] == w + len(wrapped)
    with pytest.raises(InvalidOffsetError) as off:
        log.read(3, 1 << 20)  # inside a plain message: an error as before
    assert "wrapper_offset" not in off.value.details
    records, _ = decode_messages(log.read(0, 1 << 20).tobytes(), 0)
    assert [r[3] for r in records] == [b"v0", b"v1"] + [b"w%d" % i for i in range(30)] + [b"tail"]  # nothing lost


@pytest.mark.parametrize("codec", CODECS)
def test_every_inner_offset_of_a_wrapper_is_read_as_inside_it_never_as_damage(log, codec):
    """An inner offset w + i points into the wrapper's own bytes, its header
    among them: bytes there that happen to look like a message header (a
    gzip wrapper's attributes byte equals the magic byte, so w + 1 reads as
    magic 1) are not a damaged message. Once taken for one: a Spark read from
    such an offset failed with CorruptMessageError."""
    first = log.append(encode_message_set([b"before"] * 3, timestamp_ms=1))
    values = [b"m-%05d:" % i + b"x" * (i % 50) for i in range(60)]
    w = log.append(encode_message_set(values, keys=[None if i % 3 else b"k%d" % i for i in range(60)],
                                      timestamp_ms=1_764_000_000_000, compression=codec))
    log.append(encode_message_set([b"after"] * 400, timestamp_ms=2))  # bytes enough behind it
    log.flush()
    records, _ = decode_messages(log.read(first, 1 << 20).tobytes(), first)
    inner = [r[0] for r in records if w <= r[0] < w + 60]
    assert inner == list(range(w, w + 60))
    for offset in inner[1:]:
        with pytest.raises(InvalidOffsetError) as inside:
            log.read(offset, 1 << 20)
        assert inside.value.details["wrapper_offset"] == w, offset


def test_boundaries_from_a_start_inside_a_wrapper_begin_at_its_end(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        w = log.append(encode_message_set([b"w%d" % i for i in range(20)], timestamp_ms=1, compression="gzip"))
        after = log.append(encode_message_set([b"a" * 50] * 4, timestamp_ms=2))
        log.flush()
        end = log.high_watermark
        assert log.message_boundaries(w + 5, end, [w + 6, after + 1, end - 1]) == [after, after + 72, end]
        with pytest.raises(InvalidOffsetError):
            log.message_boundaries(after + 1, end, [end - 1])  # inside a plain message: still an error
