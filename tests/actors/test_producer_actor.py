"""The producer actor: each call's ObjectRef carries the outcome of its own
messages, never another call's; a failed message never counts as sent."""

from __future__ import annotations

import pytest

from raylog.errors import DeliveryError
from raylog.storage.record_batch import encode_batch


def _consume(client, topic: str, count: int, timeout_s: float = 30.0) -> list:
    import time

    consumer = client.consumer(topic, auto_offset_reset="earliest")
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout_ms=500))
    consumer.close()
    return got


def test_a_failing_call_raises_and_the_other_call_succeeds(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=2, max_message_bytes=4096)
    handle = raylog_client.producer_actor(acks=1, batch_size=50, linger_ms=20)
    failing = handle.send_batch.remote(topic, [b"x" * 10_000], partition=0)
    fine = handle.send_batch.remote(topic, [b"ok-%d" % i for i in range(20)], partition=1)
    with pytest.raises(DeliveryError) as caught:
        ray.get(failing, timeout=60)
    assert list(caught.value.failures) == [(topic, 0)]
    assert caught.value.failures[(topic, 0)][0] == 1
    assert ray.get(fine, timeout=60) == 20
    # a later call is not handed the earlier failure
    assert ray.get(handle.send_batch.remote(topic, [b"later"], partition=1), timeout=60) == 1
    stats = ray.get(handle.flush.remote())
    assert stats["sent_messages"] == 21 and stats["failed_messages"] == 1
    ray.get(handle.close.remote())
    got = _consume(raylog_client, topic, 21)
    assert sorted(m.value for m in got) == sorted([b"ok-%d" % i for i in range(20)] + [b"later"])


def test_a_call_resolves_once_its_messages_are_acknowledged_without_a_flush(raylog_client, make_topic):
    """A lone call on an idle actor (batch far from full): its ref resolves
    after linger_ms and the messages are readable."""
    import ray

    topic = make_topic(partitions=1)
    handle = raylog_client.producer_actor(acks="all", batch_size=50, linger_ms=5)
    assert ray.get(handle.send_batch.remote(topic, [b"alone"]), timeout=30) == 1
    partition, offset = ray.get(handle.send.remote(topic, b"single"), timeout=30)
    assert (partition, offset) == (0, len(encode_batch([b"alone"], timestamp_ms=0)))  # the next batch's position
    # acks="all": visible as soon as the call returned
    assert raylog_client.offsets(topic, 0)[1] > offset
    assert [m.value for m in _consume(raylog_client, topic, 2)] == [b"alone", b"single"]
    ray.get(handle.close.remote())


def test_producer_actor_from_ray_tasks_keyed(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=3)
    handle = raylog_client.producer_actor(batch_size=10)

    @ray.remote(num_cpus=0)
    def produce(task):
        values = [b"%d-%d" % (task, i) for i in range(100)]
        return ray.get(handle.send_batch.remote(topic, values, keys=[b"k%d" % (i % 7) for i in range(100)]))

    assert sum(ray.get([produce.remote(t) for t in range(4)])) == 400
    assert ray.get(handle.stats.remote())["sent_messages"] == 400
    ray.get(handle.close.remote())
    assert len({m.value for m in _consume(raylog_client, topic, 400)}) == 400


def test_a_flush_covers_the_calls_submitted_before_it_even_when_ray_starts_it_first(raylog_client, make_topic):
    """An asynchronous actor runs its calls in any order (Ray's rule); a
    flush submitted right after sends, to an actor still starting, still
    waits for them (what ``Client.close`` relies on at a script's exit)."""
    import ray

    topic = make_topic(partitions=2)
    for round_ in range(4):
        handle = raylog_client.producer_actor(acks=1)
        sends = [handle.send_batch.remote(topic, [b"r%d-%d-%d" % (round_, c, i) for i in range(5)]) for c in range(4)]
        stats = ray.get(handle.flush.remote(30.0), timeout=120)
        assert stats["sent_messages"] == 20, (round_, stats)
        assert ray.get(sends, timeout=60) == [5] * 4
        ray.get(handle.close.remote())


def test_the_actor_sends_headers_and_tombstones_as_given(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1)
    handle = raylog_client.producer_actor(acks="all", batch_size=50, linger_ms=5)
    headers = [("trace", b"t1"), ("trace", b"t2"), ("empty", None)]
    ray.get(handle.send.remote(topic, b"v", b"k", headers=headers), timeout=30)
    ray.get(handle.send.remote(topic, None, b"k"), timeout=30)
    ray.get(handle.send.remote(topic, b"", b"k"), timeout=30)
    got = _consume(raylog_client, topic, 3)
    assert [(m.key, m.value, list(m.headers)) for m in got] == [
        (b"k", b"v", headers), (b"k", None, []), (b"k", b"", [])
    ]
    ray.get(handle.close.remote())
