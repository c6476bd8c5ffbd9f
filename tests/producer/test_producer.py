"""The producer through the public API, on real Ray, ZooKeeper and partition
actors. Failure cases first: a refused set fails alone, a stuck partition
holds no other back, a killed partition actor neither loses nor duplicates
an acknowledged message; then futures, linger and read-your-writes."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from raylog.errors import DeliveryError, MessageTooLargeError, RaylogError, UnknownPartitionError
from raylog.producer.partitioner import partition_for_key
from raylog.retry import RetryPolicy
from raylog.testing.faults import resume_process, stop_process
from tests.stored import stored_records

#: every test runs with the compiled send and with the reference (conftest.py)
BOTH_SEND_PATHS = True


def _read(client, topic: str, partition: int) -> list:
    """Every message below the high watermark: ``(offset, key, value)``."""
    return [(o, k, v) for o, _, k, v in stored_records(client, topic, partition)]


def _flush_partitions(client, topic: str, partitions: int) -> None:
    import ray

    ray.get([client.partition_actor(topic, p).flush.remote() for p in range(partitions)])


# -- failures keep their scope ---------------------------------------------------

def test_a_failure_is_counted_before_its_future_tells_it_so_close_raises_it_again(raylog_client, make_topic):
    # whoever the failed future wakes (here its callback, run as it fails) may close the producer at once:
    # the failure must be counted by then, or close() finds nothing to raise
    topic = make_topic(partitions=1, max_message_bytes=4096)
    producer = raylog_client.producer(acks=1)
    seen = []
    future = producer.send(topic, b"x" * 10_000, partition=0)
    future.add_done_callback(lambda f: seen.append(producer.failed_messages))
    with pytest.raises(MessageTooLargeError):
        future.result(timeout_s=30)
    assert seen == [1]
    with pytest.raises(DeliveryError, match="MessageTooLargeError"):
        producer.close()



def test_a_refused_set_fails_alone_and_every_other_set_is_delivered_once(raylog_client, make_topic):
    topic = make_topic(partitions=4, max_message_bytes=4096)
    producer = raylog_client.producer(acks=1)
    big = producer.send(topic, b"x" * 10_000, partition=0)
    small = [producer.send(topic, b"small-%d" % i, partition=1 + i % 3) for i in range(300)]

    with pytest.raises(DeliveryError) as caught:
        producer.flush()
    assert list(caught.value.failures) == [(topic, 0)]
    lost, error = caught.value.failures[(topic, 0)]
    assert lost == 1 and isinstance(error, MessageTooLargeError)
    assert f"{topic}-0" in str(caught.value)

    with pytest.raises(MessageTooLargeError) as one:
        big.result(timeout_s=10)
    assert (one.value.topic, one.value.partition) == (topic, 0) and str(one.value).startswith(f"{topic}-0")

    where = [f.result(timeout_s=10) for f in small]
    assert [p for p, _ in where] == [1 + i % 3 for i in range(300)]
    _flush_partitions(raylog_client, topic, 4)
    assert _read(raylog_client, topic, 0) == []
    for p in (1, 2, 3):
        stored = _read(raylog_client, topic, p)
        assert [v for _, _, v in stored] == [b"small-%d" % i for i in range(300) if 1 + i % 3 == p]
        # each future's offset is where its message is
        assert [o for o, _, _ in stored] == [o for (q, o) in where if q == p]
    stats = producer.stats()
    assert stats["sent_messages"] == 300 and stats["failed_messages"] == 1
    producer.flush()  # failures are reported once
    producer.close()


def test_a_stuck_partition_holds_no_other_back(raylog_client, make_topic):
    """Partition 0's actor is frozen (SIGSTOP): its set waits for a reply,
    while partition 1's set is acknowledged meanwhile."""
    import ray

    topic = make_topic(partitions=2)
    pid = ray.get(raylog_client.partition_actor(topic, 0).pid.remote())
    # partition 0's request would wait its full timeout; partition 1 must not
    producer = raylog_client.producer(acks=1, linger_ms=0, request_timeout_s=60)
    producer.send(topic, b"warm-0", partition=0).result(timeout_s=30)
    producer.send(topic, b"warm-1", partition=1).result(timeout_s=30)
    try:
        stop_process(pid)
        stuck = producer.send(topic, b"to-0", partition=0)
        time.sleep(0.2)  # partition 0's set is on the wire first
        free = producer.send(topic, b"to-1", partition=1)
        assert free.result(timeout_s=30)[0] == 1
        assert not stuck.done()
    finally:
        resume_process(pid)
    assert stuck.result(timeout_s=60)[0] == 0
    producer.close()


def test_unknown_partition_is_refused_at_send(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    producer = raylog_client.producer()
    with pytest.raises(UnknownPartitionError):
        producer.send(topic, b"x", partition=5)
    with pytest.raises(UnknownPartitionError):
        producer.send_batch(topic, [b"x"], partition=-1)
    assert producer.send(topic, b"kept", partition=1).result(timeout_s=30)[0] == 1
    producer.close()


def test_killed_partition_actor_every_acknowledged_message_once_in_order(raylog_client, make_topic):
    """SIGKILL the partition actor while an idempotent producer streams into
    it with retries: what was acknowledged is read back exactly once, in order."""
    import ray

    topic = make_topic(partitions=1, flush_ms=10)
    actor = raylog_client.partition_actor(topic, 0)
    old_pid = ray.get(actor.pid.remote())
    retry = RetryPolicy(max_tries=200, delay_s=0.05, max_delay_s=0.5, deadline_s=120)
    producer = raylog_client.producer(acks=1, batch_size=20, linger_ms=1, retry=retry, request_timeout_s=5)

    futures: list = []
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            futures.append((b"m-%07d" % i, producer.send(topic, b"m-%07d" % i)))
            i += 1
            if i % 200 == 0:
                time.sleep(0.005)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while sum(f.done() for _, f in futures[:3000]) < 3000:
            assert time.monotonic() < deadline, "load did not start"
            time.sleep(0.05)
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:
            try:
                if ray.get(actor.pid.remote(), timeout=10) != old_pid:
                    break
            except Exception:  # noqa: BLE001 - restarting
                pass
            assert time.monotonic() < deadline, "the partition actor did not restart"
            time.sleep(0.2)
        count = len(futures)
        deadline = time.monotonic() + 60
        while len(futures) < count + 3000:
            assert time.monotonic() < deadline, "load did not continue after the restart"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=30)
    try:
        producer.flush(timeout_s=120)
    except DeliveryError:
        pass  # messages whose outcome is an error are not acknowledged
    acknowledged = []
    for value, future in futures:
        try:
            acknowledged.append((future.result(timeout_s=1), value))
        except RaylogError:
            pass
    producer.close()
    assert len(acknowledged) > 6000
    ray.get(actor.flush.remote())
    stored = _read(raylog_client, topic, 0)
    values = [v for _, _, v in stored]
    assert len(values) == len(set(values)), f"{len(values) - len(set(values))} messages stored twice"
    at = {v: o for o, _, v in stored}
    missing = [v for _, v in acknowledged if v not in at]
    assert not missing, f"{len(missing)} acknowledged messages lost (first {missing[:3]})"
    # in order, each where its future said (an offset -1 is a duplicate whose place is not known)
    assert values == sorted(values)
    for (partition, offset), value in acknowledged:
        assert offset in (-1, at[value])


def test_a_frozen_partition_actor_gets_resent_sets_and_stores_each_once(raylog_client, make_topic):
    """The partition actor is frozen (SIGSTOP) with sets on the wire: the
    producer times out, drops the connection and resends on a new one; when
    the actor thaws it reads both copies. Each set is stored once, in order."""
    import ray

    topic = make_topic(partitions=1, flush_ms=10)
    pid = ray.get(raylog_client.partition_actor(topic, 0).pid.remote())
    retry = RetryPolicy(max_tries=50, delay_s=0.05, max_delay_s=0.5, deadline_s=60)
    producer = raylog_client.producer(acks=1, batch_size=10, linger_ms=1, retry=retry, request_timeout_s=1)
    producer.send(topic, b"warm-up").result(timeout_s=30)
    try:
        stop_process(pid)
        call = producer.send_batch(topic, [b"m-%04d" % i for i in range(100)])
        time.sleep(3)  # past the request timeout: the producer resent on a new connection
    finally:
        resume_process(pid)
    producer.flush(timeout_s=60)
    where = call.result()
    producer.close()
    ray.get(raylog_client.partition_actor(topic, 0).flush.remote())
    values = [v for _, _, v in _read(raylog_client, topic, 0)]
    assert values == [b"warm-up"] + [b"m-%04d" % i for i in range(100)]
    at = {v: o for o, _, v in _read(raylog_client, topic, 0)}
    assert [o for _, o in where] == [at[b"m-%04d" % i] for i in range(100)]


# -- futures, batches and keys ----------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_send_futures_tell_partition_and_offset(raylog_client, make_topic, compression):
    topic = make_topic(partitions=3)
    producer = raylog_client.producer(acks=1, batch_size=7, compression=compression)
    futures = [producer.send(topic, b"v%d" % i, key=b"k%d" % (i % 5)) for i in range(40)]
    call = producer.send_batch(topic, [b"b%d" % i for i in range(30)], keys=[b"k%d" % (i % 5) for i in range(30)])
    producer.flush()
    _flush_partitions(raylog_client, topic, 3)
    stored = {p: _read(raylog_client, topic, p) for p in range(3)}
    at = {v: (p, o) for p in range(3) for o, _, v in stored[p]}
    for i, future in enumerate(futures):
        partition, offset = future.result()
        assert partition == partition_for_key(b"k%d" % (i % 5), 3)
        assert (partition, offset) == at[b"v%d" % i]
    assert [tuple(r) for r in call.result()] == [at[b"b%d" % i] for i in range(30)]
    producer.close()


def test_keyed_send_batch_keeps_each_key_in_order_on_its_partition(raylog_client, make_topic):
    topic = make_topic(partitions=4)
    producer = raylog_client.producer(acks=1, batch_size=50)
    keys = [b"user-%d" % (i % 13) for i in range(1000)]
    values = [b"%s:%d" % (k, i) for i, k in enumerate(keys)]
    for start in range(0, 1000, 100):
        producer.send_batch(topic, values[start : start + 100], keys[start : start + 100])
    producer.flush()
    _flush_partitions(raylog_client, topic, 4)
    for p in range(4):
        stored = _read(raylog_client, topic, p)
        assert [v for _, _, v in stored] == [v for v, k in zip(values, keys) if partition_for_key(k, 4) == p]
        assert all(partition_for_key(k, 4) == p for _, k, _ in stored)
    # batches, not one set per message (send_batch no longer sends message by message)
    assert producer.stats()["sent_batches"] <= 1000 // 50 + 2 * 4 * 10
    producer.close()


# -- linger: a lone message leaves after linger_ms ------------------------------------------


@pytest.mark.parametrize("path", ["keyless", "keyed", "partition", "send_batch"])
def test_a_lone_message_on_an_idle_producer_leaves_after_linger(raylog_client, make_topic, path):
    """No flush: the batch is not full, yet its linger is over; the message
    is acknowledged and readable (the bound is loose, the message used to
    wait for its batch to fill, i.e. forever)."""
    topic = make_topic(partitions=2)
    producer = raylog_client.producer(acks=1, linger_ms=5, batch_size=50)
    time.sleep(0.3)  # the sender is idle, waiting for work
    if path == "keyless":
        future = producer.send(topic, b"alone")
    elif path == "keyed":
        future = producer.send(topic, b"alone", key=b"k")
    elif path == "partition":
        future = producer.send(topic, b"alone", partition=1)
    else:
        future = producer.send_batch(topic, [b"alone"])
    future.wait(5) if path == "send_batch" else future.result(timeout_s=5)
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        got = consumer.poll(timeout_ms=500)
    consumer.close()
    assert [m.value for m in got] == [b"alone"]
    producer.close()


# -- acks="all": read-your-writes ----------------------------------------------------------


def test_acks_all_flush_then_an_immediate_read_sees_everything(raylog_client, make_topic):
    # A flush timer far away: only acks="all" makes the data visible this soon.
    topic = make_topic(partitions=3, flush_ms=60_000)
    producer = raylog_client.producer(acks="all")
    for i in range(500):
        producer.send(topic, b"m%d" % i, key=b"k%d" % i)
    producer.flush()
    seen = sum(raylog_client.offsets(topic, p)[1] > 0 and len(_read(raylog_client, topic, p)) for p in range(3))
    assert seen == 500
    producer.close()


@pytest.mark.parametrize("batch_size", [1, 50])
def test_acks_1_flush_then_an_immediate_read_sees_everything(raylog_client, make_topic, batch_size):
    """acks=1 acknowledges on append; flush() waits until the partitions
    made the sets readable (docs/design.md section 6): end offsets and a
    consumer's first polls right after it see all 300 messages."""
    # A flush timer far away: only the producer's flush makes the data visible this soon.
    topic = make_topic(partitions=3, flush_ms=60_000, flush_messages=1_000_000)
    producer = raylog_client.producer(acks=1, batch_size=batch_size)
    for i in range(300):
        producer.send(topic, b"m%d" % i, key=b"k%d" % i)
    producer.flush()
    ends = raylog_client.end_offsets(topic)
    assert sum(len(_read(raylog_client, topic, p)) for p in range(3)) == 300, ends
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = []
    while any((consumer.position(topic, p) or 0) < end for p, end in ends.items()):
        polled = consumer.poll(timeout_ms=200)
        got += [m.value for m in polled]
    consumer.close()
    assert sorted(got) == sorted(b"m%d" % i for i in range(300))
    # a second flush with nothing new returns at once; more sends are readable after the next
    producer.flush()
    producer.send(topic, b"late", partition=0)
    producer.flush()
    assert _read(raylog_client, topic, 0)[-1][2] == b"late"
    producer.close()


def test_bad_settings_are_config_errors(raylog_client):
    from raylog.errors import ConfigError

    for options in ({"acks": 2}, {"acks": "some"}, {"acks": True}, {"batch_size": 0}, {"linger_ms": -1}):
        with pytest.raises(ConfigError):
            raylog_client.producer(**options)


def test_audit_events_leave_without_a_flush(raylog_client, make_topic):
    """The audit path too: the counts published on the interval reach the
    audit topic after linger_ms, with no flush and no full batch."""
    import json

    from raylog.audit import AUDIT_TOPIC

    raylog_client.ensure_audit_topic()
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1, linger_ms=5, audit=True, audit_interval_ms=200)
    producer.send(topic, b"counted").result(timeout_s=10)
    deadline = time.monotonic() + 10
    events = []
    while time.monotonic() < deadline and not events:
        _flush_partitions(raylog_client, AUDIT_TOPIC, 1)
        events = [json.loads(v) for _, _, v in _read(raylog_client, AUDIT_TOPIC, 0)]
        events = [e for e in events if e["topic"] == topic and e["source"] == producer.client_id]
        time.sleep(0.1)
    assert [e["count"] for e in events] == [1]
    producer.close()


def test_the_readme_producing_example_runs_as_written(raylog_client, make_topic, capsys):
    """docs/howto/produce-consume.md "Producing": the example block, run as written on a topic
    named clicks."""
    import re

    import raylog
    from tests.doc_blocks import block

    code = block("docs/howto/produce-consume.md", "Producing: futures, acks, idempotence")
    if "clicks" not in raylog_client.list_topics():
        raylog_client.create_topic("clicks", partitions=8)
    exec(compile(code, "produce-consume.md", "exec"), {"client": raylog_client, "raylog": raylog})
    printed = capsys.readouterr().out
    assert "20000 sent" in printed
    assert re.search(r"\[RecordMetadata\(partition=\d, offset=\d+\), RecordMetadata\(partition=\d, offset=\d+\)\]", printed)
