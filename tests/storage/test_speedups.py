"""The compiled fast path against the Python reference: the same records,
the same errors (type, message, details), for any buffer."""

import array
import contextlib
import os
import pickle
import platform
import random
import struct
import subprocess
import sys
import threading

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raylog.errors import InvalidMessageError, RaylogError
from raylog.consumer.record import Message
from raylog.storage import compression as comp
from raylog.storage import message as message_module
from raylog.storage.decoding import decode_messages
from raylog.storage.message import CODEC_LZ4, CODEC_ZSTD, HEADER_SIZE, encode_message, encode_message_set
from raylog.storage.validation import scan_message_set, validate_message_set

from conftest import COMPRESSIONS, SPEEDUPS

#: this module compares the implementations itself, in each test
BOTH_IMPLEMENTATIONS = True

pytestmark = pytest.mark.skipif(SPEEDUPS is None, reason="raylog.storage._speedups is not built")


@contextlib.contextmanager
def using(impl):
    """Run the message code as ``impl`` ("c" or "python") inside the block."""
    saved = message_module._speedups
    message_module._speedups = SPEEDUPS if impl == "c" else None
    try:
        yield
    finally:
        message_module._speedups = saved


def outcome(fn, *args, **kwargs):
    """What a call gives: its result (records with their types), or its error
    as (type, message, details)."""
    try:
        result = fn(*args, **kwargs)
    except (RaylogError, TypeError) as err:
        return ("raised", type(err), str(err), getattr(err, "details", None))
    if fn is scan_message_set:
        valid, count, err = result
        return ("scanned", valid, count, None if err is None else (type(err), str(err), err.details))
    if fn is decode_messages:
        records, consumed = result
        return ("decoded", records, [type(r) for r in records], consumed)
    return ("returned", result)


def both(fn, *args, **kwargs):
    """The outcome of ``fn`` with the C fast path and with the reference; asserts they agree."""
    with using("c"):
        fast = outcome(fn, *args, **kwargs)
    with using("python"):
        pure = outcome(fn, *args, **kwargs)
    assert fast == pure
    return fast


def reseal(msg) -> bytes:
    msg = bytes(msg)
    return msg[:4] + struct.pack(">I", crc32c(msg[8:])) + msg[8:]


def boundaries(buf) -> list[int]:
    """The positions of the whole messages of ``buf`` (by their size fields only)."""
    pos, out = 0, []
    while pos + 4 <= len(buf):
        (size,) = struct.unpack_from(">I", buf, pos)
        if size < HEADER_SIZE - 4 or pos + 4 + size > len(buf):
            break
        out.append(pos)
        pos += 4 + size
    return out


# --------------------------------------------------------------------------
# CRC32C


def test_crc32c_matches_the_crc32c_package_on_random_data():
    rng = random.Random(1)
    data = rng.randbytes(300_000)
    lengths = list(range(0, 80)) + [rng.randrange(80, 20_000) for _ in range(200)] + [SPEEDUPS.GIL_RELEASE_BYTES, 299_990]
    for length in lengths:
        start = rng.randrange(0, 8)  # every alignment
        chunk = memoryview(data)[start : start + length]
        value = rng.choice([0, 0xFFFFFFFF, rng.getrandbits(32)])
        expected = crc32c(chunk, value)
        assert SPEEDUPS.crc32c(chunk, value) == expected, (length, start)
        assert SPEEDUPS.crc32c_table(chunk, value) == expected, (length, start)
        if value == 0:
            assert SPEEDUPS.crc32c(chunk) == SPEEDUPS.crc32c_table(chunk) == crc32c(chunk)


def test_crc32c_continues_like_one_call():
    data = os.urandom(1000)
    for cut in (0, 1, 7, 8, 500, 1000):
        for fn in (SPEEDUPS.crc32c, SPEEDUPS.crc32c_table):
            assert fn(data[cut:], fn(data[:cut])) == crc32c(data)


def test_crc32c_uses_sse42_when_the_cpu_has_it():
    assert SPEEDUPS.CRC32C_IMPL in ("sse4.2", "table")
    if platform.machine() == "x86_64" and os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            has_sse42 = " sse4_2" in f.read()
        assert SPEEDUPS.CRC32C_IMPL == ("sse4.2" if has_sse42 else "table")


# --------------------------------------------------------------------------
# where and why the fast path stops


def test_scan_and_decode_say_where_and_why_they_stop():
    plain = encode_message_set([b"a" * 10, b"b" * 20], [None, b"key"], 5)
    wrapper = encode_message_set([b"c"] * 3, timestamp_ms=5, compression="lz4")
    first = len(encode_message_set([b"a" * 10], timestamp_ms=5))
    s = SPEEDUPS
    assert s.scan(plain, 1 << 20) == (len(plain), 2, s.STATUS_END)
    assert s.scan(b"", 1 << 20) == (0, 0, s.STATUS_END)
    assert s.scan(plain + wrapper + plain, 1 << 20) == (len(plain), 2, s.STATUS_HEADER)
    assert s.scan(plain[:-1], 1 << 20) == (first, 1, s.STATUS_TAIL)
    assert s.scan(plain + b"\0" * 21, 1 << 20) == (len(plain), 2, s.STATUS_TAIL)
    assert s.scan(plain, 30) == (first, 1, s.STATUS_TAIL)  # the second is over the limit
    assert s.scan(plain, -1) == (0, 0, s.STATUS_TAIL)
    assert s.scan(plain, 1 << 80) == (len(plain), 2, s.STATUS_END)
    damaged = bytearray(plain)
    damaged[-1] ^= 1
    assert s.scan(damaged, 1 << 20) == (first, 1, s.STATUS_CRC)
    assert s.scan(plain, 1.5) == (0, 0, s.STATUS_ARGS)

    records, consumed, status = s.decode(plain + wrapper, 100, 1 << 20, None, None, None)
    assert (records, consumed, status) == (
        [(100, 5, None, b"a" * 10), (100 + first, 5, b"key", b"b" * 20)],
        len(plain),
        s.STATUS_HEADER,
    )
    for odd in ((plain, 2**63, 1 << 20, None), (plain, 1.0, 1 << 20, None), (plain, 0, "1", None), (plain, 0, 99, list)):
        assert s.decode(*odd, "t", 0) == ([], 0, s.STATUS_ARGS)


def test_wrong_arguments_are_type_errors():
    with pytest.raises(TypeError):
        SPEEDUPS.scan(b"")
    with pytest.raises(TypeError):
        SPEEDUPS.scan("text", 10)
    with pytest.raises(TypeError):
        SPEEDUPS.decode([1, 2], 0, 10, None, None, None)
    with pytest.raises(TypeError):
        SPEEDUPS.crc32c()


def test_accelerated_tells_which_code_runs_and_the_environment_can_force_python():
    assert message_module.ACCELERATED is (message_module._speedups is not None)
    code = "import raylog.storage.message as m; print(m.ACCELERATED, m._speedups is None)"
    env = {**os.environ, "RAYLOG_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    env["RAYLOG_PURE_PYTHON"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]


# --------------------------------------------------------------------------
# the same results and errors as the reference


values = st.binary(max_size=48)
keys = st.none() | st.binary(max_size=12)
stamps = st.sampled_from([0, 7, -1, 2**62, -(2**63), 1_700_000_000_000])


@st.composite
def message_sets(draw):
    """Plain and compressed sets back to back, with wrappers that are wrong
    in every way a wrapper can be, then random damage."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        msgs = draw(st.lists(st.tuples(values, keys, stamps), max_size=8))
        vals, ks, ts = [m[0] for m in msgs], [m[1] for m in msgs], [m[2] for m in msgs]
        kind = draw(st.sampled_from(["plain", "plain", "plain", "compressed", "compressed", "nested", "bad_inner", "bad_stream"]))
        if kind == "plain":
            parts.append(encode_message_set(vals, ks, ts))
        elif kind == "compressed":
            parts.append(encode_message_set(vals, ks, ts, draw(st.sampled_from(COMPRESSIONS[1:]))))
        elif kind == "nested":
            once = encode_message_set([b"v", *vals], timestamp_ms=3, compression="lz4")
            parts.append(encode_message(comp.compress(CODEC_LZ4, once), codec=CODEC_LZ4, timestamp_ms=3))
        elif kind == "bad_inner":
            inner = bytearray(encode_message_set([b"v", *vals], ks + [None], ts + [0]))
            inner[draw(st.integers(0, len(inner) - 1))] ^= draw(st.integers(1, 255))
            parts.append(encode_message(comp.compress(CODEC_ZSTD, bytes(inner)), codec=CODEC_ZSTD, timestamp_ms=1))
        else:
            parts.append(encode_message(draw(values), codec=draw(st.integers(1, 3)), timestamp_ms=2))
    buf = bytearray(b"".join(parts))
    for _ in range(draw(st.integers(0, 2))):
        damage = draw(st.sampled_from(["flip", "cut", "garbage", "header", "size"]))
        starts = boundaries(buf)
        if damage == "flip" and buf:
            buf[draw(st.integers(0, len(buf) - 1))] ^= draw(st.integers(1, 255))
        elif damage == "cut" and buf:
            del buf[draw(st.integers(0, len(buf) - 1)) :]
        elif damage == "garbage":
            buf += draw(st.binary(min_size=1, max_size=30))
        elif damage == "header" and starts:
            # a wrong magic, attributes or key length under a good CRC
            pos = draw(st.sampled_from(starts))
            end = pos + 4 + struct.unpack_from(">I", buf, pos)[0]
            field = draw(st.sampled_from([(8, ">B"), (9, ">B"), (18, ">i")]))
            value = draw(st.integers(0, 255) if field[1] == ">B" else st.integers(-3, 80))
            msg = bytearray(buf[pos:end])
            struct.pack_into(field[1], msg, field[0], value)
            buf[pos:end] = reseal(msg)
        elif damage == "size" and starts:
            pos = draw(st.sampled_from(starts))
            struct.pack_into(">I", buf, pos, draw(st.sampled_from([0, 17, 18, 100, 2**31, 2**32 - 1])))
    return bytes(buf)


limits = st.sampled_from([1 << 20, 1 << 20, 64, 40])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message_sets(), limits, st.integers(0, 2**40), st.booleans(), st.booleans())
def test_decode_gives_exactly_what_the_reference_gives(buf, limit, base, partial_tail_ok, typed):
    kwargs = {"max_message_bytes": limit, "partial_tail_ok": partial_tail_ok}
    if typed:
        kwargs.update(record_type=Message, prefix=("topic", 3))
    both(decode_messages, buf, base, **kwargs)
    both(decode_messages, bytearray(buf), base, **kwargs)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message_sets(), limits, st.integers(0, 2**40), st.booleans())
def test_scan_and_validate_give_exactly_what_the_reference_gives(buf, limit, base, check_inner):
    both(scan_message_set, buf, limit, base_offset=base, check_inner=check_inner)
    both(scan_message_set, memoryview(buf), limit, base_offset=base, check_inner=check_inner)
    both(validate_message_set, buf, limit)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(values, keys, stamps), max_size=12), st.sampled_from(COMPRESSIONS))
def test_valid_sets_decode_and_validate_alike(msgs, compression):
    buf = encode_message_set([m[0] for m in msgs], [m[1] for m in msgs], [m[2] for m in msgs], compression)
    result = both(decode_messages, buf, 0, partial_tail_ok=False)
    assert result[0] == "decoded" and result[3] == len(buf)
    assert both(validate_message_set, buf) == ("returned", len(msgs) if compression is None else int(bool(msgs)))


def test_every_damaged_byte_gives_the_same_error_in_a_large_set():
    # large enough for the fast path to release the GIL
    count = (SPEEDUPS.GIL_RELEASE_BYTES // 200 + 100) // 2 * 2
    buf = encode_message_set([os.urandom(178)] * count, [None, b"k"] * (count // 2), 9)
    assert len(buf) > SPEEDUPS.GIL_RELEASE_BYTES
    rng = random.Random(2)
    for pos in [rng.randrange(len(buf)) for _ in range(40)] + [len(buf) - 1, 0]:
        damaged = bytearray(buf)
        damaged[pos] ^= 0x10
        result = both(decode_messages, bytes(damaged), 10, partial_tail_ok=False)
        assert result[0] == "raised" and issubclass(result[1], InvalidMessageError)
        both(scan_message_set, damaged, 1 << 20, base_offset=5)
    both(decode_messages, buf[:-7], 10)


def test_odd_arguments_fall_back_to_the_reference():
    buf = encode_message_set([b"a", b"b"], timestamp_ms=1)
    both(decode_messages, buf, 2**64)  # past an int64: the reference's ints
    both(decode_messages, buf, -5)
    both(decode_messages, buf, 0, max_message_bytes=2**70)
    both(decode_messages, buf, 0, max_message_bytes=-1)
    both(decode_messages, buf, 0, max_message_bytes=17.5)
    both(decode_messages, buf, 0, record_type=list, prefix=("t", 0))  # TypeError from tuple.__new__
    both(decode_messages, buf, 0, record_type=tuple, prefix=("t", 0))
    both(scan_message_set, buf, 2**70)
    both(scan_message_set, buf, -1)


# --------------------------------------------------------------------------
# typed records


def test_typed_records_are_real_instances():
    data = encode_message_set([b"a", b"bb", b"ccc"], [None, b"k", None], 7) * 2
    with using("c"):
        typed, used = decode_messages(data, 100, record_type=Message, prefix=("t", 3))
    assert used == len(data) and len(typed) == 6
    first = typed[1]
    assert type(first) is Message and isinstance(first, tuple)
    assert (first.topic, first.partition, first.offset, first.timestamp, first.key, first.value) == (
        "t", 3, 100 + HEADER_SIZE + 1, 7, b"k", b"bb",
    )
    assert first == ("t", 3, 100 + HEADER_SIZE + 1, 7, b"k", b"bb") and len(first) == 6
    assert first._asdict()["value"] == b"bb" and first._replace(value=b"x").value == b"x"
    assert hash(first) == hash(tuple(first)) and "value=b'bb'" in repr(first)
    assert pickle.loads(pickle.dumps(first)) == first
    with pytest.raises(AttributeError):
        first.value = b"other"


class Record(tuple):
    """A tuple subclass with an instance dict (unlike a NamedTuple)."""

    @property
    def value(self):
        return self[5]


def test_any_tuple_subclass_and_plain_tuples():
    data = encode_message_set([b"a", b"b"], [None, b"k"], 1, None) + encode_message_set([b"c"], compression="zstd")
    result = both(decode_messages, data, 0, record_type=Record, prefix=(None, -1))
    records = result[1]
    assert [type(r) for r in records] == [Record] * 3 and records[2].value == b"c"
    records[0].note = "an instance dict works"
    assert records[0].note == "an instance dict works"
    result = both(decode_messages, data, 0, record_type=tuple, prefix=("t", 0))
    assert [type(r) for r in result[1]] == [tuple] * 3


def test_decoded_messages_are_left_out_of_the_garbage_collector():
    # A message holds only str, int, bytes and None: it cannot be in a
    # reference cycle, so the compiled decoder untracks it at once (a
    # consumer holding a million messages would otherwise have the collector
    # walk them all again and again); anything that could be in a cycle
    # stays tracked.
    import gc
    import weakref

    data = encode_message_set([b"a", b"b"], [None, b"k"], 1)
    with using("c"):
        typed, _ = decode_messages(data, 0, record_type=Message, prefix=("t", 0))
        plain, _ = decode_messages(data, 0)
        with_dict, _ = decode_messages(data, 0, record_type=Record, prefix=("t", 0))
        holding_a_list, _ = decode_messages(data, 0, record_type=Message, prefix=(["t"], 0))
    assert [gc.is_tracked(r) for r in typed + plain] == [False] * 4
    assert [gc.is_tracked(r) for r in with_dict + holding_a_list] == [True] * 4
    # a record that can hold itself is still freed by the collector
    class Probe:
        pass

    record, probe = with_dict[0], Probe()
    record.me, record.probe = record, probe
    gone = weakref.ref(probe)
    del record, probe, with_dict
    gc.collect()
    assert gone() is None


def test_decoding_leaks_no_references():
    topic = "refcount-topic-" + os.urandom(4).hex()
    data = encode_message_set([b"v"] * 50, [b"k"] * 50, 3)
    with using("c"):
        decode_messages(data, 0, record_type=Message, prefix=(topic, 1))  # warm up
        before = (sys.getrefcount(topic), sys.getrefcount(Message))
        for _ in range(20):
            records, _ = decode_messages(data, 0, record_type=Message, prefix=(topic, 1))
            del records
        assert (sys.getrefcount(topic), sys.getrefcount(Message)) == before


# --------------------------------------------------------------------------
# buffers


def test_every_buffer_type_gives_the_same_result():
    data = encode_message_set([b"x" * 30, b"y"], [b"k", None], 4) + encode_message_set([b"z"], compression="gzip")
    padded = b"..." + data + b"!"  # a view that starts at an odd address
    buffers = [
        data,
        bytearray(data),
        memoryview(data),
        memoryview(padded)[3:-1],
        memoryview(bytearray(padded))[3:-1],
        array.array("B", data),
    ]
    if len(data) % 4 == 0:
        buffers.append(memoryview(data).cast("I"))
    expected = both(decode_messages, data, 50)
    for buf in buffers:
        assert both(decode_messages, buf, 50) == expected
        assert both(scan_message_set, buf)[1:] == (len(data), 3, None)
        assert both(validate_message_set, buf) == ("returned", 3)
    # not contiguous: decoded from a copy, as the reference does
    spread = bytes(b for byte in data for b in (byte, 0))
    assert both(decode_messages, memoryview(spread)[::2], 50) == expected


def test_a_bytearray_is_read_in_place():
    data = bytearray(encode_message_set([b"v" * 100] * 10, timestamp_ms=1))
    with using("c"):
        records, consumed = decode_messages(data, 0)
    data[:] = b"\0" * len(data)  # the records hold copies
    assert consumed == len(data) and all(r[3] == b"v" * 100 for r in records)


def test_threads_decode_large_sets_at_once():
    data = encode_message_set([os.urandom(200) for _ in range(2000)], timestamp_ms=1)
    with using("python"):
        expected = decode_messages(data, 0)
    results = []

    def work():
        for _ in range(5):
            results.append(decode_messages(data, 0) == expected and validate_message_set(data) == 2000)

    with using("c"):
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [True] * 20


def test_compiled_timestamps_pass_matches_the_reference():
    import random

    from raylog.storage import timeindex
    from raylog.storage.message import encode_message_set

    if SPEEDUPS is None:
        pytest.skip("the compiled module is not built")
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randrange(0, 30)
        data = encode_message_set(
            [rng.randbytes(rng.randrange(0, 40)) for _ in range(n)],
            keys=[rng.choice([None, b"k"]) for _ in range(n)],
            timestamp_ms=[rng.randrange(-(10**12), 10**13) for _ in range(n)],
        )
        data = bytearray(data)
        if data and rng.random() < 0.3:
            data[rng.randrange(len(data))] ^= 0xFF  # damaged sizes stop both the same way
        start = rng.randrange(0, len(data) + 1)
        end = rng.randrange(start, len(data) + 1)
        assert SPEEDUPS.timestamps(data, start, end) == timeindex.timestamps_reference(data, start, end)
    with pytest.raises(ValueError):
        SPEEDUPS.timestamps(b"abc", 2, 1)
