"""The pool's lag of a partition (raylog.pool.lag, a real cluster) when the
group's committed offset lies inside a compressed wrapper: the position
after an inner message (docs/design.md §2), which is what a pool member
commits mid-wrapper. The lag is known (the wrapper is read from its start),
not an error that leaves the autoscaler blind."""

from __future__ import annotations

from raylog.pool.lag import partition_lag


class _Store:
    def __init__(self, committed):
        self.value = committed

    def committed(self, group, topic, partition):
        return self.value


def test_a_commit_inside_a_compressed_wrapper_has_a_known_lag(raylog_client, make_topic):
    topic = make_topic(1)
    producer = raylog_client.producer(compression="zstd", batch_size=100, linger_ms=50, acks="all")
    futures = [producer.send(topic, b"v%03d" % i, partition=0) for i in range(100)]
    producer.flush()
    producer.close()
    offsets = [f.result().offset for f in futures]
    inner = offsets[10]  # the 11th message: inside a wrapper
    assert offsets[0] < inner < offsets[-1]
    row = partition_lag(raylog_client.metadata, _Store(inner), "g", topic, 0)
    assert row["error"] is None, row
    assert row["committed"] == inner and row["lag_s"] is not None and row["lag_messages"] > 0
