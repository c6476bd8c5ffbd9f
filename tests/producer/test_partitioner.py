"""Key → partition is stable and never negative; keyless batches move on."""

from __future__ import annotations

import subprocess
import sys

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from raylog.errors import ConfigError
from raylog.producer.partitioner import StickyPartitioner, group_by_partition, partition_for_key


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_is_in_range_and_is_the_crc32c(key, partitions):
    p = partition_for_key(key, partitions)
    assert 0 <= p < partitions and p == crc32c(key) % partitions


def test_zero_partitions_is_a_config_error():
    with pytest.raises(ConfigError):
        partition_for_key(b"k", 0)


def test_the_mapping_is_the_same_in_another_process_with_another_hash_seed():
    keys = [b"user-%d" % i for i in range(50)]
    here = [partition_for_key(k, 7) for k in keys]
    code = "from raylog.producer.partitioner import partition_for_key as f; print([f(b'user-%d' % i, 7) for i in range(50)])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONHASHSEED": "12345"}, timeout=60
    ).stdout
    assert out.strip() == str(here)


def test_sticky_partition_holds_until_a_batch_is_sent_then_moves():
    sticky = StickyPartitioner(seed=1)
    first = sticky.partition("t", 4)
    assert all(sticky.partition("t", 4) == first for _ in range(10))
    sticky.batch_sent("t", 4)
    assert sticky.partition("t", 4) != first
    seen = set()
    for _ in range(200):
        seen.add(sticky.partition("t", 4))
        sticky.batch_sent("t", 4)
    assert seen == {0, 1, 2, 3}


def test_sticky_with_one_partition_stays_put():
    sticky = StickyPartitioner(seed=1)
    sticky.batch_sent("t", 1)
    assert sticky.partition("t", 1) == 0


def _group_both(values, keys, partitions):
    from raylog.storage import message as message_module

    saved = message_module._speedups
    try:
        fast = group_by_partition(values, keys, partitions)
        message_module._speedups = None
        pure = group_by_partition(values, keys, partitions)
    finally:
        message_module._speedups = saved
    return fast, pure


@given(
    st.lists(st.tuples(st.binary(max_size=30), st.one_of(st.none(), st.binary(max_size=12))), max_size=60),
    st.integers(min_value=1, max_value=40),
)
def test_grouping_by_partition_is_the_same_compiled_and_in_python(msgs, partitions):
    values = [v for v, _ in msgs]
    keys = [k for _, k in msgs]
    fast, pure = _group_both(values, keys, partitions)
    assert fast == pure
    # every message exactly once, in the call's order within its partition
    assert sorted(i for g in pure for i in g[1]) == list(range(len(msgs)))
    for p, positions, vs, ks, total, largest in pure:
        assert all(partition_for_key(keys[i], partitions) == p if keys[i] is not None else p == -1 for i in positions)
        assert positions == sorted(positions) and vs == [values[i] for i in positions] and ks == [keys[i] for i in positions]
        assert total == sum(len(v) + len(k or b"") for v, k in zip(vs, ks))
        assert largest == max(len(v) + len(k or b"") for v, k in zip(vs, ks))
    assert [g[0] for g in pure] == sorted(g[0] for g in pure)


def test_grouping_odd_arguments_falls_back_or_raises():
    fast, pure = _group_both((bytearray(b"v"),), (b"k",), 3)  # not bytes: the Python code
    assert fast == pure
    with pytest.raises(ConfigError):
        group_by_partition([b"v"], [b"k"], 0)


# -- the other key hashes (raylog.producer.partitioner.PARTITIONERS) ---------

#: Kafka's own murmur2 vectors (its Java client's UtilsTest.testMurmur2)
MURMUR2_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_is_kafkas_java_clients_hash():
    from raylog.producer.partitioner import murmur2_partition

    for key, signed in MURMUR2_VECTORS.items():
        assert murmur2_partition(key, 1 << 31) == (signed & 0x7FFFFFFF) % (1 << 31)
        assert murmur2_partition(key, 7) == (signed & 0x7FFFFFFF) % 7


def test_crc32_is_zlibs_unsigned_crc():
    import zlib

    from raylog.producer.partitioner import crc32_partition

    assert zlib.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value
    assert crc32_partition(b"123456789", 1 << 32) == 0xCBF43926
    assert crc32_partition(b"123456789", 10) == 0xCBF43926 % 10


def test_an_unknown_partitioner_is_refused_naming_the_choices():
    from raylog.producer.partitioner import key_partitioner

    with pytest.raises(ConfigError, match="'crc32c', 'murmur2', 'crc32'.*got 'fnv'"):
        key_partitioner("fnv")


@given(st.lists(st.tuples(st.binary(max_size=30), st.one_of(st.none(), st.binary(max_size=12))), max_size=40),
       st.integers(min_value=1, max_value=40), st.sampled_from(["murmur2", "crc32"]))
def test_grouping_with_another_hash_follows_that_hash(msgs, partitions, name):
    from raylog.producer.partitioner import key_partitioner

    hash_of = key_partitioner(name)
    values = [v for v, _ in msgs]
    keys = [k for _, k in msgs]
    groups = group_by_partition(values, keys, partitions, None, hash_of)
    assert sorted(i for g in groups for i in g[1]) == list(range(len(msgs)))
    for p, positions, *_ in groups:
        assert all(hash_of(keys[i], partitions) == p if keys[i] is not None else p == -1 for i in positions)
