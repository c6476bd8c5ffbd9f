"""The compiled encoder (``_speedups.encode``) against the Python reference:
the same bytes for any values, keys, timestamps and compression, and the
reference's errors for whatever the encoder leaves to it."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.errors import ConfigError
from raylog.storage import message as message_module
from raylog.storage.compression import decompress
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set

from conftest import SPEEDUPS

#: this module compares the implementations itself, in each test
BOTH_IMPLEMENTATIONS = True

pytestmark = pytest.mark.skipif(SPEEDUPS is None, reason="raylog.storage._speedups is not built")

keys_or_none = st.one_of(st.none(), st.binary(max_size=40))
timestamps = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def encoded(impl, *args):
    """encode_message_set(*args) with ``impl`` ("c" or "python"): bytes, or the error raised."""
    saved = message_module._speedups
    message_module._speedups = SPEEDUPS if impl == "c" else None
    try:
        return encode_message_set(*args)
    except (ConfigError, struct.error, TypeError) as err:
        return (type(err), str(err))
    finally:
        message_module._speedups = saved


def inner_of(data: bytes, compression) -> bytes:
    """The uncompressed set (compressors may embed times, so compare what they hold)."""
    if compression is None or not data:
        return data
    codec = data[9] & 7
    return decompress(codec, memoryview(data)[22:], 1 << 30)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=300), keys_or_none, timestamps), max_size=40),
    st.sampled_from(["none", "all", "mixed"]),
    st.booleans(),
    timestamps,
    st.sampled_from([None, "gzip", "zstd", "lz4"]),
)
def test_c_and_python_encode_the_same_bytes(msgs, keyed, per_message_ts, one_ts, compression):
    values = [v for v, _, _ in msgs]
    keys = None if keyed == "none" else [k if keyed == "mixed" else (k or b"") for _, k, _ in msgs]
    ts = [t for _, _, t in msgs] if per_message_ts else one_ts
    fast = encoded("c", values, keys, ts, compression)
    pure = encoded("python", values, keys, ts, compression)
    if compression is None:
        assert fast == pure
    else:
        assert fast[:4] == pure[:4] and fast[8:18] == pure[8:18]  # size, magic, attributes, timestamp
        assert inner_of(fast, compression) == inner_of(pure, compression)
    records, used = decode_messages(fast, 0)
    assert used == len(fast)
    assert [(r[2], r[3]) for r in records] == [(k, v) for k, v in zip(keys or [None] * len(values), values)]


@pytest.mark.parametrize(
    "args",
    [
        ([b"a", b"b"], [b"k"], 1),  # fewer keys than values
        ([b"a", b"b"], None, [1]),  # fewer timestamps than values
        ([b"a"], None, 2**63),  # a timestamp outside int64
        ([b"a"], None, [-(2**63) - 1]),
        ([b"a"], [1], 1),  # a key that is not bytes
    ],
)
def test_what_the_encoder_leaves_alone_gets_the_reference_error(args):
    fast, pure = encoded("c", *args), encoded("python", *args)
    assert isinstance(fast, tuple) and fast == pure


@pytest.mark.parametrize(
    "values,keys,ts",
    [
        ([bytearray(b"abc"), memoryview(b"de")], None, 5),  # other buffers: the reference joins them
        ((b"a", b"b"), (b"k", None), (1, 2)),  # tuples work like lists
        (iter([b"a"]), None, 1),
        ([b"a"], None, True),  # an int subclass
        ([], None, 7),
    ],
)
def test_other_sequences_and_buffers_give_the_reference_bytes(values, keys, ts):
    materialized = list(values) if not isinstance(values, (list, tuple)) else values
    fast = encoded("c", materialized, keys, ts)
    assert fast == encoded("python", materialized, keys, ts)


def test_the_encoder_declines_what_it_does_not_handle():
    assert SPEEDUPS.encode([bytearray(b"a")], None, 1) is None
    assert SPEEDUPS.encode([b"a"], [b"k", b"l"], 1) is None
    assert SPEEDUPS.encode([b"a"], None, 1.5) is None
    assert SPEEDUPS.encode([b"a"], None, [2**64]) is None
    assert SPEEDUPS.encode(b"a", None, 1) is None
    with pytest.raises(TypeError):
        SPEEDUPS.encode([b"a"], None)
