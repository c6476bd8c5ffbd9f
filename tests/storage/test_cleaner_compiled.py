"""The compiled cleaner (raylog.storage._compaction) against the Python
reference (raylog.storage.cleaner, raylog.storage.offsetmap): the map in
fixed slots answers as the dict map does, names keys with the same BLAKE2b
digest and stays within its bytes; random logs (short and long keys,
tombstones, headers, compressed, idempotent and transactional batches,
small and large maps) cleaned pass after pass by each give the same files
byte for byte; a damaged batch raises the reference's error; and the walks
let other threads run."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raylog.config import TopicConfig
from raylog.errors import CorruptMessageError
from raylog.storage import cleaner, offsetmap
from raylog.storage.log import PartitionLog
from raylog.storage.offsetmap import ENTRY_BYTES, OffsetMap
from raylog.storage.record_batch import encode_batch

from conftest import flip_byte
from test_cleaner import read_all

compaction = pytest.importorskip("raylog.storage._compaction")

BOTH_IMPLEMENTATIONS = True  # the module compares the two itself (conftest)

CONFIG = TopicConfig(cleanup_policy="compact", flush_messages=1, flush_ms=10**9, segment_bytes=700,
                     max_message_bytes=700, min_compaction_lag_ms=0, delete_retention_ms=1000)


@contextlib.contextmanager
def reference():
    """The cleaner's Python reference alone until the block ends."""
    saved = cleaner._compaction, offsetmap._compaction  # noqa: SLF001
    cleaner._compaction = offsetmap._compaction = None  # noqa: SLF001
    try:
        yield
    finally:
        cleaner._compaction, offsetmap._compaction = saved  # noqa: SLF001


# -- the map --------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 127, 128, 129, 256, 1000])
def test_long_keys_are_named_by_the_blake2b_digest_of_the_reference(size):
    data = bytes(range(256)) * 4
    assert compaction.blake2b_16(data[:size]) == hashlib.blake2b(data[:size], digest_size=16).digest()


def test_the_map_refuses_a_bad_size_as_the_reference_does():
    with pytest.raises(ValueError, match="at least 24"):
        compaction.SlotMap(ENTRY_BYTES - 1)
    with pytest.raises(ValueError, match="at least 24"):
        OffsetMap(ENTRY_BYTES - 1)


keys = st.one_of(st.binary(max_size=3), st.binary(min_size=14, max_size=40))
operation = st.one_of(
    st.tuples(st.just("put"), keys),
    st.tuples(st.just("put_many"), st.lists(keys, max_size=8)),
    st.tuples(st.just("get_many"), st.lists(keys, max_size=8)),
)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=12), st.lists(operation, max_size=40))
def test_the_slot_map_answers_as_the_dict_map(entries, operations):
    buffer_bytes = entries * ENTRY_BYTES + 5
    slots, ref = compaction.SlotMap(buffer_bytes, 99), OffsetMap(buffer_bytes)
    assert slots.capacity == ref.capacity
    offset = 0
    for kind, arg in operations:
        if kind == "put":
            assert slots.put(arg, offset) == ref.put(arg, offset)
            offset += 1
        elif kind == "put_many":
            assert slots.put_many(arg, offset) == ref.put_many(arg, offset)
            offset += len(arg)
        else:
            assert slots.get_many(arg) == ref.get_many(arg)
        assert (len(slots), slots.full, slots.latest_offset) == (len(ref), ref.full, ref.latest_offset)
    slots.clear()
    assert (len(slots), slots.latest_offset) == (0, -1)


def test_the_table_grows_in_place_and_never_past_its_bytes():
    buffer_bytes = 200_000 * ENTRY_BYTES
    m = compaction.SlotMap(buffer_bytes, 7)
    first = m.table_bytes
    names = [b"key-%d" % i for i in range(m.capacity)] + [os.urandom(20) for _ in range(1000)]
    taken = m.put_many(names, 0)
    assert taken == m.capacity  # full: the rest refused, as the reference refuses them
    assert first < m.table_bytes <= buffer_bytes
    assert m.get_many(names[:taken:997]) == list(range(0, taken, 997))
    assert m.get(names[-1]) == -1
    assert m.put(names[0], 10**9) and m.get(names[0]) == 10**9  # a key it holds takes a later offset


# -- the passes -----------------------------------------------------------------

SHORT = [b"a", b"b", b"c", b"d"]
LONG = [b"a-key-of-more-than-sixteen-bytes-%d" % i for i in range(3)]
record = st.tuples(st.sampled_from(SHORT + LONG), st.one_of(st.none(), st.binary(max_size=12)),
                   st.sampled_from([None, None, [("h", b"1")], [("é", None), ("h", b"")]]))
batch = st.tuples(
    st.lists(record, min_size=1, max_size=6),
    st.sampled_from([None, None, None, "gzip", "zstd"]),
    st.sampled_from(["plain", "plain", "plain", "idempotent", "transactional"]),
)
step = st.one_of(
    st.lists(batch, min_size=1, max_size=4).map(lambda batches: ("write", batches)),
    st.tuples(st.just("clean"), st.sampled_from([1, 2, 4, 100]), st.booleans()),
)


def files(directory) -> dict:
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith((".log", ".index", ".cleaned", ".swap")):
            with open(os.path.join(directory, name), "rb") as f:
                out[name] = f.read()
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=24))
def test_the_compiled_passes_write_what_the_reference_writes(steps):
    sequences = {7: 0, 8: 0}
    with tempfile.TemporaryDirectory() as root:
        fast_dir, ref_dir = os.path.join(root, "fast"), os.path.join(root, "ref")
        with PartitionLog(fast_dir, CONFIG) as fast, PartitionLog(ref_dir, CONFIG) as ref:
            for item in steps:
                if item[0] == "write":
                    for records, codec, kind in item[1]:
                        extra = {}
                        if kind != "plain":
                            pid = 7 if kind == "idempotent" else 8
                            extra = dict(producer_id=pid, producer_epoch=0, base_sequence=sequences[pid],
                                         transactional=kind == "transactional")
                            sequences[pid] += len(records)
                        data = encode_batch([v for _k, v, _h in records], keys=[k for k, _v, _h in records],
                                            headers=[h for _k, _v, h in records], timestamp_ms=1000,
                                            compression=codec, **extra)
                        assert fast.append(data) == ref.append(data)
                    fast.flush()
                    ref.flush()
                    continue
                _, map_keys, late = item
                now_ms = 10**13 if late else 1500
                got = fast.clean(now_ms=now_ms, buffer_bytes=ENTRY_BYTES * map_keys, force=True)
                with reference():
                    want = ref.clean(now_ms=now_ms, buffer_bytes=ENTRY_BYTES * map_keys, force=True)
                assert got == want
                assert files(fast_dir) == files(ref_dir)
            assert read_all(fast) == read_all(ref)


def test_a_damaged_batch_fails_the_pass_as_in_the_reference_and_loses_nothing(tmp_path):
    results = {}
    for impl in ("compiled", "reference"):
        directory = tmp_path / impl
        log = PartitionLog(directory, CONFIG)
        for i in range(40):
            log.append(encode_batch([b"v%d" % i] * 3, keys=[b"k%d" % (i % 4)] * 3, timestamp_ms=1000))
        log.flush()
        first = sorted(n for n in os.listdir(directory) if n.endswith(".log"))[1]
        before = files(directory)
        flip_byte(directory / first, 70)  # inside the first batch's records: its CRC fails
        with reference() if impl == "reference" else contextlib.nullcontext():
            with pytest.raises(CorruptMessageError) as raised:
                log.clean(now_ms=10**13, force=True)
        results[impl] = str(raised.value)
        after = files(directory)
        assert after.keys() == before.keys()  # no segment replaced, none lost, no .cleaned file left
        assert all(after[n] == before[n] for n in before if n != first)
        log.close()
    assert "fails its CRC32C check" in results["compiled"]
    assert results["compiled"] == results["reference"]


def test_a_walk_lets_other_threads_run():
    data = b"".join(encode_batch([b"x" * 100] * 50, keys=[b"k%d" % i for i in range(50)], timestamp_ms=1)
                    for _ in range(4000))
    m = compaction.SlotMap(1 << 20)
    in_walk = threading.Event()
    seen = []

    def other(wake):
        wake.wait()  # woken while the walk runs; it gets the interpreter only if the walk released it
        seen.append(in_walk.is_set())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)  # the walking thread gives the interpreter up only where it releases it
    try:
        for _ in range(20):
            for walk in (lambda: compaction.map_batches(m, data, 0, 0, 1 << 20),
                         lambda: compaction.plan_batches(m, data, 0, b"", 0, 1 << 20)):
                wake = threading.Event()
                thread = threading.Thread(target=other, args=(wake,))
                thread.start()
                in_walk.set()
                wake.set()
                walk()
                in_walk.clear()
                thread.join()
            if all(seen[-2:]):
                break
    finally:
        sys.setswitchinterval(interval)
    assert seen[-2:] == [True, True]
