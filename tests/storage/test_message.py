"""The message format: failures first, then layout and round trips."""

import struct
import tracemalloc

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.errors import ConfigError, CorruptMessageError, InvalidMessageError, MessageTooLargeError
from raylog.storage import compression as comp
from raylog.storage.decoding import decode_messages
from raylog.storage.message import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_ZSTD,
    DEFAULT_MAX_MESSAGE_BYTES,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    codec_id,
    encode_message,
    encode_message_set,
)
from raylog.storage.validation import validate_message_set

from conftest import COMPRESSIONS


def reseal(msg: bytes) -> bytes:
    """Recompute the CRC of a message whose body was edited on purpose."""
    return msg[:4] + struct.pack(">I", crc32c(msg[8:])) + msg[8:]


def flip(buf: bytes, pos: int) -> bytes:
    return buf[:pos] + bytes([buf[pos] ^ 0x40]) + buf[pos + 1 :]


# --------------------------------------------------------------------------
# failures


@pytest.mark.parametrize("where", [4, 8, 9, 12, 20, 22, 30])
def test_flipped_byte_is_a_corrupt_message_naming_its_offset(where):
    first = encode_message(b"first value", key=b"k1", timestamp_ms=1)
    second = encode_message(b"second value!", key=b"key-2", timestamp_ms=2)
    buf = first + flip(second, where) + first
    with pytest.raises(CorruptMessageError) as err:
        decode_messages(buf, 1000)
    assert err.value.offset == 1000 + len(first)
    with pytest.raises(CorruptMessageError) as err:
        validate_message_set(buf)
    assert err.value.offset == len(first)


def test_every_damaged_byte_of_a_plain_message_among_equal_timestamps_is_caught():
    # Plain messages sharing a timestamp take the decoder's fastest path.
    one = encode_message(b"plain value", timestamp_ms=1_700_000_000_000)
    for where in range(4, len(one)):
        buf = one * 3 + flip(one, where) + one
        with pytest.raises(CorruptMessageError) as err:
            decode_messages(buf, 100)
        assert err.value.offset == 100 + 3 * len(one), where
        with pytest.raises(CorruptMessageError):
            validate_message_set(buf)


def test_size_of_2_gib_is_refused_before_any_allocation():
    buf = struct.pack(">I", 2 << 30) + b"\0" * 40
    tracemalloc.start()
    try:
        with pytest.raises(MessageTooLargeError) as err:
            decode_messages(buf, 0)
        assert err.value.offset == 0 and err.value.size == 2 << 30
        with pytest.raises(MessageTooLargeError):
            validate_message_set(buf)
        with pytest.raises(MessageTooLargeError):
            decode_messages(buf[:4], 0)  # even the bare size field is enough
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_message_above_the_configured_maximum_is_refused():
    buf = encode_message_set([b"x" * 1000, b"y" * 5000], timestamp_ms=0)
    with pytest.raises(MessageTooLargeError) as err:
        validate_message_set(buf, max_message_bytes=2000)
    assert err.value.offset == 1000 + HEADER_SIZE
    with pytest.raises(MessageTooLargeError):
        decode_messages(buf, 0, max_message_bytes=2000)


def test_size_below_the_fixed_header_is_invalid():
    buf = struct.pack(">II", 10, 0) + b"\0" * 30
    with pytest.raises(InvalidMessageError, match="less than the minimum") as err:
        validate_message_set(buf)
    assert err.value.offset == 0
    with pytest.raises(InvalidMessageError):
        decode_messages(buf, 0)


def test_partial_tail_is_left_for_the_next_fetch_or_refused():
    whole = encode_message_set([b"a" * 50, b"b" * 50], timestamp_ms=0)
    one = len(whole) // 2
    for cut in (1, 3, 4, 21, 22, one - 1):
        buf = whole[: one + cut]
        records, consumed = decode_messages(buf, 7)
        assert [r[3] for r in records] == [b"a" * 50] and consumed == one
        with pytest.raises(InvalidMessageError) as err:
            decode_messages(buf, 7, partial_tail_ok=False)
        assert err.value.offset == 7 + one and err.value.partial
        with pytest.raises(InvalidMessageError):
            validate_message_set(buf)


@pytest.mark.parametrize(
    "magic,attrs,klen,match",
    [(0, 0, -1, "magic"), (2, 0, -1, "magic"), (1, 0x08, -1, "attributes"), (1, 0x04, -1, "attributes"),
     (1, 0, -2, "key_length"), (1, 0, 1000, "key_length")],
)
def test_bad_magic_attributes_or_key_length_with_a_good_crc(magic, attrs, klen, match):
    good = encode_message(b"value", timestamp_ms=3)
    bad = reseal(good[:8] + struct.pack(">BBqi", magic, attrs, 3, klen) + good[HEADER_SIZE:])
    buf = good + bad
    with pytest.raises(InvalidMessageError, match=match) as err:
        validate_message_set(buf)
    assert err.value.offset == len(good)
    assert not isinstance(err.value, CorruptMessageError)
    with pytest.raises(InvalidMessageError, match=match) as err:
        decode_messages(buf, 5)
    assert err.value.offset == 5 + len(good)


@pytest.mark.parametrize("codec", [CODEC_GZIP, CODEC_ZSTD, CODEC_LZ4])
def test_wrapper_whose_value_is_not_a_stream_of_its_codec(codec):
    inner = encode_message_set([b"v"] * 3, timestamp_ms=0)
    for value in (b"not compressed at all", comp.compress(codec, inner)[:-3], comp.compress(codec, inner) + b"xx"):
        wrapper = encode_message(value, timestamp_ms=0, codec=codec)
        with pytest.raises(InvalidMessageError) as err:
            validate_message_set(encode_message(b"a") + wrapper)
        assert err.value.offset == len(encode_message(b"a"))
        with pytest.raises(InvalidMessageError):
            decode_messages(wrapper, 0)


def test_wrapper_whose_inner_set_is_corrupt():
    inner = bytearray(encode_message_set([b"hello"] * 3, timestamp_ms=0))
    inner[-1] ^= 1
    wrapper = encode_message(comp.compress(CODEC_ZSTD, bytes(inner)), codec=CODEC_ZSTD)
    with pytest.raises(CorruptMessageError) as err:
        validate_message_set(wrapper)
    assert err.value.offset == 0 and err.value.inner_offset > 0
    with pytest.raises(CorruptMessageError) as err:
        decode_messages(wrapper, 64)
    assert err.value.offset == 64


def test_nested_wrappers_are_refused():
    once = encode_message_set([b"v"] * 3, compression="lz4")
    twice = encode_message(comp.compress(CODEC_LZ4, once), codec=CODEC_LZ4)
    with pytest.raises(InvalidMessageError, match="nest"):
        validate_message_set(twice)
    with pytest.raises(InvalidMessageError, match="nest"):
        decode_messages(twice, 0)


def test_decompression_bomb_is_refused_before_allocation():
    # a zstd frame that declares a huge content size
    big = comp.compress(CODEC_ZSTD, b"\0" * (2 << 20))
    wrapper = encode_message(big, codec=CODEC_ZSTD)
    with pytest.raises(MessageTooLargeError):
        validate_message_set(wrapper, max_message_bytes=16 << 10)  # inner limit 1 MiB
    for codec in (CODEC_GZIP, CODEC_LZ4):
        wrapper = encode_message(comp.compress(codec, b"\0" * (2 << 20)), codec=codec)
        with pytest.raises(MessageTooLargeError):
            decode_messages(wrapper, 0, max_message_bytes=16 << 10)


def test_unknown_compression_and_mismatched_arguments():
    with pytest.raises(ConfigError):
        codec_id("snappy")
    with pytest.raises(ConfigError):
        encode_message_set([b"a"], compression="brotli")
    with pytest.raises(ConfigError):
        encode_message_set([b"a", b"b"], keys=[b"k"])
    with pytest.raises(ConfigError):
        encode_message_set([b"a", b"b"], timestamp_ms=[1])
    with pytest.raises(ConfigError):
        encode_message(b"a", codec=7)


# --------------------------------------------------------------------------
# layout


def test_byte_layout_field_by_field():
    msg = encode_message(b"VALUE", key=b"KEY", timestamp_ms=0x0102030405060708, codec=CODEC_NONE)
    assert MAGIC == 1 and LOG_OVERHEAD == 4 and HEADER_SIZE == 22
    size, crc, magic, attrs, ts, klen = struct.unpack_from(">IIBBqi", msg)
    assert size == len(msg) - 4 == 18 + 3 + 5
    assert crc == crc32c(msg[8:])
    assert (magic, attrs, ts, klen) == (1, 0, 0x0102030405060708, 3)
    assert msg[22:25] == b"KEY" and msg[25:] == b"VALUE"
    nokey = encode_message(b"", timestamp_ms=-5)
    assert len(nokey) == 22 and struct.unpack_from(">qi", nokey, 10) == (-5, -1)


def test_codec_ids():
    assert (CODEC_NONE, CODEC_GZIP, CODEC_ZSTD, CODEC_LZ4) == (0, 1, 2, 3)
    assert [codec_id(c) for c in COMPRESSIONS] == [0, 1, 2, 3]
    assert DEFAULT_MAX_MESSAGE_BYTES == 1 << 20


def test_compressed_set_is_one_wrapper_carrying_the_codec(compression):
    buf = encode_message_set([b"x" * 100] * 20, timestamp_ms=9, compression=compression)
    count = validate_message_set(buf)
    if compression is None:
        assert count == 20
    else:
        assert count == 1
        assert buf[9] == codec_id(compression)
        assert len(buf) < 20 * 100


# --------------------------------------------------------------------------
# round trips


def test_round_trip_with_keys_and_timestamps(compression):
    values = [b"", b"v1", b"\x00" * 300, b"last"]
    keys = [None, b"", b"key", None]
    stamps = [1, -1, 2**62, 0]
    buf = encode_message_set(values, keys, stamps, compression)
    records, consumed = decode_messages(buf, 4096)
    assert consumed == len(buf)
    assert [(r[1], r[2], r[3]) for r in records] == list(zip(stamps, keys, values))
    offsets = [r[0] for r in records]
    if compression is None:
        assert offsets[0] == 4096 and offsets == sorted(set(offsets))
    else:
        assert offsets == [4096, 4097, 4098, 4099]  # inner message i reports the wrapper's offset + i


def test_two_sets_back_to_back_and_buffer_types(compression):
    a = encode_message_set([b"a1", b"a2"], timestamp_ms=1, compression=compression)
    b = encode_message_set([b"b1"], keys=[b"k"], timestamp_ms=2, compression=compression)
    for buf in (a + b, bytearray(a + b), memoryview(a + b)):
        records, consumed = decode_messages(buf, 0)
        assert [r[3] for r in records] == [b"a1", b"a2", b"b1"] and consumed == len(a) + len(b)
        assert records[-1][0] == len(a)
        assert validate_message_set(buf) == (3 if compression is None else 2)


def test_empty_set():
    assert encode_message_set([]) == b"" == encode_message_set([], compression="zstd")
    assert decode_messages(b"", 10) == ([], 0)
    assert validate_message_set(b"") == 0


def test_default_timestamp_is_now():
    import time

    before = int(time.time() * 1000)
    (rec,), _ = decode_messages(encode_message_set([b"v"]), 0)
    assert before - 1 <= rec[1] <= int(time.time() * 1000) + 1


messages = st.lists(
    st.tuples(st.binary(max_size=64), st.none() | st.binary(max_size=16), st.integers(-(2**63), 2**63 - 1)),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(messages, st.sampled_from(COMPRESSIONS))
def test_any_messages_round_trip(msgs, compression):
    values = [m[0] for m in msgs]
    keys = [m[1] for m in msgs]
    stamps = [m[2] for m in msgs]
    buf = encode_message_set(values, keys, stamps, compression)
    validate_message_set(buf)
    records, consumed = decode_messages(buf, 0, partial_tail_ok=False)
    assert consumed == len(buf)
    assert [(r[1], r[2], r[3]) for r in records] == list(zip(stamps, keys, values))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=40), st.none() | st.binary(max_size=8)), min_size=1, max_size=6),
    st.sampled_from([None, [7] * 6, [1, 2, 2, 3, 3, 3]]),
    st.data(),
)
def test_any_single_damaged_byte_is_refused(msgs, stamps, data):
    stamps = 7 if stamps is None else stamps[: len(msgs)]
    buf = bytearray(encode_message_set([m[0] for m in msgs], [m[1] for m in msgs], stamps))
    pos = data.draw(st.integers(0, len(buf) - 1))
    buf[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(InvalidMessageError):
        validate_message_set(bytes(buf))
    with pytest.raises(InvalidMessageError):
        decode_messages(bytes(buf), 0, partial_tail_ok=False)


def test_zstd_frame_without_declared_size_is_refused():
    import zstandard

    inner = encode_message_set([b"v"] * 3, timestamp_ms=0)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(inner)
    with pytest.raises(InvalidMessageError, match="content size"):
        validate_message_set(encode_message(frame, codec=CODEC_ZSTD))


@pytest.mark.parametrize("compression", [None, "gzip", "zstd", "lz4"])
def test_typed_records_match_plain_records(compression):
    from raylog.consumer.record import Message

    data = encode_message_set([b"a", b"bb", b"ccc"], [None, b"k", None], 7, compression) * 2
    plain, used = decode_messages(data, 100)
    typed, used_typed = decode_messages(data, 100, record_type=Message, prefix=("t", 3))
    assert used == used_typed
    assert [tuple(m) for m in typed] == [("t", 3, *r) for r in plain]
    if compression is None:
        assert all(type(m) is Message for m in typed)
    else:  # the inner messages of each wrapper: derived next offsets, the last one's stored (the wrapper's end)
        from raylog.consumer.record import InnerMessage, WrappedMessage

        assert [type(m) for m in typed] == [InnerMessage, InnerMessage, WrappedMessage] * 2
        wrapper_end = 100 + len(data) // 2
        assert [m.next_offset for m in typed] == [101, 102, wrapper_end, wrapper_end + 1, wrapper_end + 2, 100 + len(data)]
