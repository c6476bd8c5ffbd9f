"""Key → partition is stable and never negative; keyless batches move on."""

from __future__ import annotations

import subprocess
import sys

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from raylog.errors import ConfigError
from raylog.producer.partitioner import StickyPartitioner, partition_for_key


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
