"""A group's lag in messages (``describe_group``'s ``lag_messages``, raylog
groups describe) is counted by the partition, not estimated: exact over
compressed batches of records whose sizes differ from the sample at the
committed offset, from the log start when the committed offset is before
it, and 0 at the end. On a real cluster (ZooKeeper, Ray, the partitions'
data servers)."""

from __future__ import annotations

import os

from raylog.transfer.connection import BrokerConnection
from tests.stored import stored_records


def positions(client, topic):
    """The offsets of every record of ``topic``-0."""
    return [r[0] for r in stored_records(client, topic)]


def test_lag_in_messages_is_counted_by_the_partition_over_compressed_batches(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(compression="gzip", batch_size=500, linger_ms=50)
    # small compressible records first, then large random ones: a mean size near
    # the committed offset says nothing of the records after it
    for i in range(3000):
        producer.send(topic, b"small %06d" % i, partition=0)
    producer.flush()
    for _ in range(300):
        producer.send(topic, os.urandom(2000), partition=0)
    producer.close()
    offsets = positions(raylog_client, topic)
    assert len(offsets) == 3300
    group = f"g-{topic}"
    committed = offsets[1000]
    raylog_client.reset_offsets(group, topic, to="offset", offset=committed, dry_run=False)
    (row,) = raylog_client.describe_group(group)
    assert row["committed"] == committed
    assert row["lag_messages"] == 2300
    assert row["lag_messages_estimate"] != 2300  # what the estimate would have said
    # answered again from the partition's record counts: the same
    assert raylog_client.describe_group(group)[0]["lag_messages"] == 2300

    raylog_client.reset_offsets(group, topic, to="latest", dry_run=False)
    assert raylog_client.describe_group(group)[0]["lag_messages"] == 0


def test_the_same_count_on_the_wire_walks_once_then_answers_whole(raylog_client, make_topic):
    """COUNT on a partition's data socket: a small walk bound makes the first
    count of a range take several requests; the range, walked, is then
    answered by one request with the same bound."""
    topic = make_topic(partitions=1, segment_bytes=1 << 20)
    producer = raylog_client.producer(batch_size=200, linger_ms=5)
    for _ in range(12_000):
        producer.send(topic, os.urandom(300), partition=0)
    producer.close()
    start, end = raylog_client.offsets(topic, 0)
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
    with BrokerConnection(host, port, token=raylog_client.settings.token) as conn:
        pos = total = requests = 0
        while pos < end:
            counted, pos = conn.count(topic, 0, pos, end, 256 * 1024)
            total, requests = total + counted, requests + 1
        assert total == 12_000 and requests > 3
        assert conn.count(topic, 0, start, end, 256 * 1024) == (12_000, end)
