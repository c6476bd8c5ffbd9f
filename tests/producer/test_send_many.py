"""``Producer.send_many``: any iterable, any length, one future whose
results are in the call's order; each key's messages stay in order; a bad
key list fails with the messages before it intact."""

from __future__ import annotations

import pytest

from raylog.errors import ConfigError
from raylog.producer import producer as producer_module
from raylog.producer.partitioner import partition_for_key

from test_producer import _read as _values  # (offset, key, value) of a partition


def test_send_many_takes_a_generator_in_slices_and_keeps_the_call_order(raylog_client, make_topic, monkeypatch):
    monkeypatch.setattr(producer_module, "SEND_MANY_SLICE", 64)  # several slices
    topic = make_topic(partitions=3)
    producer = raylog_client.producer(acks="all", batch_size=50)
    keys = [b"k%d" % (i % 7) if i % 5 else None for i in range(500)]
    values = [b"v%d" % i for i in range(500)]
    call = producer.send_many(topic, iter(values), iter(keys))
    assert len(call) == 500
    results = call.result(timeout_s=30)
    producer.flush()
    assert len(results) == 500
    for key, (partition, _offset) in zip(keys, results):
        if key is not None:
            assert partition == partition_for_key(key, 3)
    stored = {(p, o): (k, v) for p in range(3) for o, k, v in _values(raylog_client, topic, p)}
    # every message exactly once, at the (partition, offset) its result names
    assert len(stored) == 500
    assert [stored[r] for r in results] == list(zip(keys, values))
    for key in set(keys) - {None}:
        mine = [r for r, k in zip(results, keys) if k == key]
        assert mine == sorted(mine)  # each key's messages in the call's order
    producer.close()


def test_send_many_with_too_few_keys_fails_and_keeps_what_came_before(raylog_client, make_topic, monkeypatch):
    monkeypatch.setattr(producer_module, "SEND_MANY_SLICE", 10)
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks="all")
    with pytest.raises(ConfigError):
        producer.send_many(topic, [b"v%d" % i for i in range(25)], [b"k"] * 15)
    producer.flush()
    assert [v for _, _, v in _values(raylog_client, topic, 0)] == [b"v%d" % i for i in range(10)]
    with pytest.raises(ConfigError):
        producer.send_many(topic, [b"a"], [b"k", b"l"])  # more keys than values
    with pytest.raises(TypeError):
        producer.send_many(topic, ["text"])
    assert producer.send_many(topic, []).result() == []
    producer.close()
