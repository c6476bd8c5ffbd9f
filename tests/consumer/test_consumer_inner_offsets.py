"""One record offset per message through the consumer (docs/design.md §2):
inner messages of compressed wrappers have offsets of their own, a commit
inside a wrapper resumes at the next message, a seek inside a wrapper starts
at that message, a seek past a batch's last record goes on at the next batch
(format 1's plain messages, where such a seek is a typed error, are covered
by tests/transfer/test_fetch_inside_wrapper.py and tests/storage/). Real
ZooKeeper, Ray, partition actors and sockets."""

from __future__ import annotations

import time

SESSION_MS = 3000


def _three_wrappers(client, topic: str) -> tuple[list[bytes], list[int]]:
    """300 messages in 3 zstd wrappers of 100 in partition 0, then one plain
    message; the values and the offsets the producer acknowledged."""
    import ray

    values = [b"w-%03d" % i for i in range(300)]
    offsets = []
    for s in range(3):
        producer = client.producer(acks=1, batch_size=10**6, linger_ms=60_000, compression="zstd")
        futures = [producer.send(topic, v, partition=0) for v in values[100 * s : 100 * (s + 1)]]
        producer.flush()
        producer.close()
        offsets += [f.result()[1] for f in futures]
    plain = client.producer(acks=1)
    plain.send(topic, b"plain-after", partition=0).result()
    plain.close()
    ray.get(client.partition_actor(topic, 0).flush.remote())
    return values, offsets


def _poll_n(consumer, n: int, timeout_s: float = 60.0) -> list:
    """Exactly ``n`` messages, polled with max_messages so that none is handed out past them."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"{n - len(got)} of {n} messages never arrived"
        got += consumer.poll(timeout_ms=200, max_messages=n - len(got))
    return got


def test_a_compressed_topic_gives_every_message_its_own_offset_and_commits_resume_inside(
    raylog_client, make_topic
):
    topic = make_topic(partitions=1)
    values, acked = _three_wrappers(raylog_client, topic)
    assert len(set(acked)) == 300 and acked == sorted(acked)  # the producer's acknowledgements, too
    wrappers = acked[0::100]
    assert acked == [w + i for w in wrappers for i in range(100)]

    group = f"g-{topic}"
    first = raylog_client.consumer(topic, group=group, auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                                   auto_commit_interval_ms=0)
    try:
        got = _poll_n(first, 150)
        assert [m.value for m in got] == values[:150]
        assert [m.offset for m in got] == acked[:150]  # distinct, increasing: the acknowledged offsets
        assert [m.next_offset for m in got[:-1]] == acked[1:150]
        assert first.position(topic, 0) == acked[150]  # inside the second wrapper
        first.commit()
        assert first.committed((topic, 0)) == acked[150]
    finally:
        first.close()

    second = raylog_client.consumer(topic, group=group, auto_offset_reset="earliest", session_timeout_ms=SESSION_MS)
    try:
        rest = _poll_n(second, 151)
        assert [m.value for m in rest] == values[150:] + [b"plain-after"]  # exactly from message 151, once
        assert [m.offset for m in rest[:-1]] == acked[150:]
        assert rest[-2].next_offset == rest[-1].offset  # after a wrapper's last message: the wrapper's end
    finally:
        second.close()


def test_a_seek_inside_a_batch_starts_there_and_past_its_last_record_at_the_next_batch(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    values, acked = _three_wrappers(raylog_client, topic)
    consumer = raylog_client.consumer(topic)
    try:
        consumer.assign([(topic, 0)])
        consumer.seek(topic, 0, acked[242])
        got = _poll_n(consumer, 58)
        assert [m.value for m in got] == values[242:]
        assert [m.offset for m in got] == acked[242:]
        plain = _poll_n(consumer, 1)[0]
        assert plain.value == b"plain-after"
        # inside a batch past its last record (a record batch of one): no
        # record there, so the consumer goes on at the next batch
        consumer.seek(topic, 0, plain.offset + 3)
        later = raylog_client.producer(acks=1)
        later.send(topic, b"later", partition=0).result()
        later.close()
        assert [m.value for m in _poll_n(consumer, 1)] == [b"later"]
        consumer.seek(topic, 0, acked[0])  # nothing lost
        again = _poll_n(consumer, 302)
        assert [m.value for m in again] == values + [b"plain-after", b"later"]
    finally:
        consumer.close()
