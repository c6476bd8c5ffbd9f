"""``Client.count_messages``: messages between two offsets of a partition,
counted on its node, from a message's offset or one inside a compressed
set; None past the walk bound; bad input a typed error."""

from __future__ import annotations

import pytest

from raylog.errors import ConfigError


def _produce(client, topic, n, compression=None):
    producer = client.producer(acks=1, batch_size=10, linger_ms=2, compression=compression)
    try:
        for i in range(n):
            producer.send(topic, b"v%04d" % i, partition=0)
        producer.flush()
    finally:
        producer.close()
    client.partition_actor(topic, 0)  # served
    import ray

    ray.get(client.partition_actor(topic, 0).flush.remote())


def _offsets(client, topic):
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        got = []
        end = client.end_offsets(topic)[0]
        while (consumer.position(topic, 0) or 0) < end:
            got += [m.offset for m in consumer.poll(timeout_ms=300)]
        return got, end
    finally:
        consumer.close()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_counts_from_any_message_offset_to_the_end(raylog_client, make_topic, compression):
    topic = make_topic(partitions=1)
    _produce(raylog_client, topic, 95, compression)
    offsets, end = _offsets(raylog_client, topic)
    assert len(offsets) == 95
    assert raylog_client.count_messages(topic, 0, 0) == 95
    for i in (1, 7, 50, 94):  # inside a compressed set too (its inner offsets)
        assert raylog_client.count_messages(topic, 0, offsets[i]) == 95 - i
        assert raylog_client.count_messages(topic, 0, offsets[i], end) == 95 - i
    assert raylog_client.count_messages(topic, 0, end) == 0
    assert raylog_client.count_messages(topic, 0, 0, max_walk_bytes=1) is None
    with pytest.raises(ConfigError, match="max_walk_bytes"):
        raylog_client.count_messages(topic, 0, 0, max_walk_bytes=0)
    if compression is None:  # a record's offset inside a record batch (record i of the batch at p is p + i)
        assert offsets[4] == offsets[3] + 1 and raylog_client.count_messages(topic, 0, offsets[3] + 1) == 91
    assert raylog_client.count_messages(topic, 0, 0) == 95  # nothing changed
