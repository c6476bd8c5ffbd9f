"""Helpers of the Spark read tests (test_read.py, test_range_reader.py,
test_avro_values.py): producing into topics and reading them back straight
from the partitions' data sockets, not through the code under test."""

from __future__ import annotations

from tests.stored import stored_records


def produce(client, topic: str, messages, compression=None, batch_size: int = 50) -> None:
    """Send ``(key, value)`` pairs with acks=1 and flush every partition, so
    that everything is below the high watermark."""
    import ray

    producer = client.producer(acks=1, batch_size=batch_size, linger_ms=1, compression=compression)
    for key, value in messages:
        producer.send(topic, value, key)
    producer.flush()
    producer.close()
    partitions = client.metadata.partitions(topic)
    ray.get([client.partition_actor(topic, p).flush.remote() for p in range(partitions)])


def log_messages(client, topic: str) -> list[tuple]:
    """Every message of ``topic`` as ``(partition, offset, key, value, timestamp_ms)``."""
    return [(p, o, k, v, ts) for p in range(client.metadata.partitions(topic))
            for o, ts, k, v in stored_records(client, topic, p)]


def ordered(messages) -> list[tuple]:
    """``(partition, offset, key, value, timestamp_ms)`` tuples sorted; the
    inner messages of a compressed set share an offset, and keys may be None."""
    return sorted(messages, key=lambda m: (m[0], m[1], m[2] is not None, m[2] or b"", m[3], m[4]))


def as_tuples(rows) -> list[tuple]:
    return ordered(
        (
            r["partition"],
            r["offset"],
            None if r["key"] is None else bytes(r["key"]),
            bytes(r["value"]),
            round(r["timestamp"].timestamp() * 1000),
        )
        for r in rows
    )


def make_clicks(raylog_client, topic: str) -> str:
    """A three-partition topic of 600 messages, keyed and unkeyed, of varied sizes, in record batches
    of at most 10 (a read is cut at batch boundaries: many batches, many possible cuts)."""
    raylog_client.create_topic(topic, partitions=3)
    messages = [
        (None if i % 4 == 0 else b"user-%d" % (i % 17), b"click-%05d:" % i + b"x" * (i % 97)) for i in range(600)
    ]
    produce(raylog_client, topic, messages, batch_size=10)
    return topic
