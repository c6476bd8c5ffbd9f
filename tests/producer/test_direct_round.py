"""The direct round (``batch_size=1`` with acks 1 or "all"): one message at
a time is written on the caller's thread and its reply read by the thread
that waits for it, with every guarantee of the workers' path: ordering,
idempotence across a lost connection (stored once), futures resolved once,
typed errors that fail one message alone. Real ZooKeeper, Ray and partition
actors; faults are injected at the producer's connection."""

from __future__ import annotations

import threading
import time

import pytest

from raylog.errors import BrokerUnavailableError, MessageTooLargeError, RequestTimeoutError
from raylog.producer import sender as sender_module
from raylog.transfer.connection import BrokerConnection
from tests.stored import stored_records

BOTH_SEND_PATHS = True

#: a bound on any one wait of these tests (a loaded machine)
WAIT_S = 30.0


def _read(client, topic: str, partition: int = 0) -> list:
    """Every message below the high watermark: ``(offset, value)``."""
    return [(o, v) for o, _, _, v in stored_records(client, topic, partition)]


def _read_until(client, topic: str, count: int) -> list:
    deadline = time.monotonic() + WAIT_S
    got = _read(client, topic)
    while len(got) < count and time.monotonic() < deadline:
        time.sleep(0.05)
        got = _read(client, topic)
    return got


def _warm_up(producer, topic: str) -> None:
    """One message through the workers (it sets the connection up), then
    wait until the worker has given the partition back."""
    producer.send(topic, b"warm-up").result(timeout_s=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while producer._acc.draining and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def threads_on_the_wire(monkeypatch):
    """The names of the threads that wrote a set and read its reply through
    the direct round's two halves (``write_set``, ``read_set_reply``)."""
    seen = {"write": [], "read": []}
    write, read = BrokerConnection.write_set, BrokerConnection.read_set_reply
    produce_sets = BrokerConnection.produce_sets

    def sets(self, topic, partition, message_sets, *args, **kwargs):  # the workers' rounds
        seen["write"].extend([threading.current_thread().name] * len(message_sets))
        seen["read"].extend([threading.current_thread().name] * len(message_sets))
        return produce_sets(self, topic, partition, message_sets, *args, **kwargs)

    def write_set(self, *args, **kwargs):
        seen["write"].append(threading.current_thread().name)
        return write(self, *args, **kwargs)

    def read_set_reply(self, *args, **kwargs):
        seen["read"].append(threading.current_thread().name)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(BrokerConnection, "write_set", write_set)
    monkeypatch.setattr(BrokerConnection, "read_set_reply", read_set_reply)
    monkeypatch.setattr(BrokerConnection, "produce_sets", sets)
    return seen


@pytest.mark.parametrize("acks", [1, "all"])
def test_one_at_a_time_goes_and_returns_on_the_callers_thread_in_order(
    raylog_client, make_topic, threads_on_the_wire, acks
):
    topic = make_topic()
    producer = raylog_client.producer(batch_size=1, acks=acks)
    _warm_up(producer, topic)
    offsets = [producer.send(topic, b"m%d" % i).result().offset for i in range(50)]
    me = threading.current_thread().name
    assert threads_on_the_wire["write"][-50:] == [me] * 50
    assert threads_on_the_wire["read"][-50:] == [me] * 50
    assert offsets == sorted(offsets) and len(set(offsets)) == 50
    stored = _read_until(raylog_client, topic, 51)
    assert [v for _, v in stored] == [b"warm-up"] + [b"m%d" % i for i in range(50)]
    assert [o for o, _ in stored][1:] == offsets
    assert producer.stats()["sent_messages"] == 51 and producer.stats()["buffered"] == 0
    producer.close()


def test_sends_without_waiting_queue_behind_a_direct_round_in_order(raylog_client, make_topic):
    topic = make_topic()
    producer = raylog_client.producer(batch_size=1, acks=1)
    _warm_up(producer, topic)
    futures = [producer.send(topic, b"m%d" % i) for i in range(300)]  # the first goes direct
    offsets = [f.result(timeout_s=WAIT_S).offset for f in futures]
    assert offsets == sorted(offsets) and len(set(offsets)) == 300
    stored = _read_until(raylog_client, topic, 301)
    assert [v for _, v in stored] == [b"warm-up"] + [b"m%d" % i for i in range(300)]
    producer.close()


def test_a_future_nobody_waits_for_is_resolved_once_all_the_same(raylog_client, make_topic):
    topic = make_topic()
    producer = raylog_client.producer(batch_size=1, acks=1)
    _warm_up(producer, topic)
    calls = []
    done = threading.Event()

    def callback(future):
        calls.append(future.result().offset)
        done.set()

    producer.send(topic, b"alone").add_done_callback(callback)
    assert done.wait(WAIT_S), "a direct round nobody waited for was never resolved"
    time.sleep(0.2)
    assert len(calls) == 1
    producer.close()


def test_a_wait_with_a_timeout_reads_the_reply_or_leaves_it_to_a_worker(
    raylog_client, make_topic, threads_on_the_wire
):
    topic = make_topic()
    producer = raylog_client.producer(batch_size=1, acks=1)
    _warm_up(producer, topic)
    me = threading.current_thread().name
    assert producer.send(topic, b"timed").result(timeout_s=WAIT_S).offset > 0
    assert threads_on_the_wire["read"][-1] == me
    # a timeout too short for the reply: the worker reads it, the wait
    # times out, and the future is resolved once all the same
    future = producer.send(topic, b"short")
    try:
        future.result(timeout_s=0)
    except RequestTimeoutError:
        pass
    assert future.result(timeout_s=WAIT_S).offset > 0
    assert threads_on_the_wire["read"][-1] != me or len(threads_on_the_wire["read"]) >= 3
    stored = _read_until(raylog_client, topic, 3)
    assert [v for _, v in stored] == [b"warm-up", b"timed", b"short"]
    producer.close()


def test_a_connection_lost_before_the_reply_resends_with_the_same_sequence_and_stores_once(
    raylog_client, make_topic, monkeypatch
):
    topic = make_topic()
    producer = raylog_client.producer(batch_size=1, acks=1)
    _warm_up(producer, topic)
    read = BrokerConnection.read_set_reply
    cuts = []
    me = threading.current_thread()

    def read_set_reply(self, correlation_id):
        if len(cuts) < 3 and threading.current_thread() is me:
            # the set was written (and will be stored): the connection dies
            # before its reply is read
            cuts.append(correlation_id)
            self.close()
            raise BrokerUnavailableError("injected: the connection was lost before the reply")
        return read(self, correlation_id)

    monkeypatch.setattr(BrokerConnection, "read_set_reply", read_set_reply)
    offsets = [producer.send(topic, b"m%d" % i).result(timeout_s=WAIT_S).offset for i in range(10)]
    assert len(cuts) == 3, (cuts, offsets)
    assert offsets == sorted(offsets) and len(set(offsets)) == 10
    stored = _read_until(raylog_client, topic, 11)
    time.sleep(0.3)
    stored = _read(raylog_client, topic)
    assert [v for _, v in stored] == [b"warm-up"] + [b"m%d" % i for i in range(10)]  # each once
    assert producer.stats()["failed_messages"] == 0
    producer.close()


def test_a_set_the_partition_refuses_fails_alone_with_its_typed_error(raylog_client, make_topic):
    topic = make_topic(max_message_bytes=1000)
    producer = raylog_client.producer(batch_size=1, acks=1)
    _warm_up(producer, topic)
    # The producer's own check is out of the way: the partition refuses the set.
    producer._acc._limits[topic] = 1 << 20
    before = producer.send(topic, b"before").result(timeout_s=WAIT_S).offset
    big = producer.send(topic, b"x" * 5000)
    with pytest.raises(MessageTooLargeError) as refused:
        big.result()
    assert str(refused.value).startswith(f"{topic}-0")
    after = producer.send(topic, b"after").result(timeout_s=WAIT_S).offset
    assert after > before
    stored = _read_until(raylog_client, topic, 3)
    assert [v for _, v in stored] == [b"warm-up", b"before", b"after"]
    assert producer.stats()["failed_messages"] == 1
    with pytest.raises(Exception) as lost:
        producer.flush()
    assert f"{topic}-0" in str(lost.value)
    producer.close()


def test_without_a_connection_the_first_message_takes_the_workers_path(raylog_client, make_topic):
    topic = make_topic()
    producer = raylog_client.producer(batch_size=1, acks=1)
    assert producer.send(topic, b"first").result(timeout_s=WAIT_S).offset == 0
    assert sender_module.MAX_IN_FLIGHT_SETS >= 1
    producer.close()


def test_direct_and_batched_sends_interleaved_through_lost_replies_are_stored_once_in_order(
    raylog_client, make_topic, monkeypatch
):
    """One-at-a-time sends (some waited for, some not) interleaved with
    send_batch and send_many calls on one partition, while replies are lost
    on both paths (the caller's direct read and the workers' rounds: the set
    is stored, the connection dies before its reply is read): every message
    is stored exactly once, in the order of the calls."""
    topic = make_topic()
    producer = raylog_client.producer(batch_size=1, acks=1)
    _warm_up(producer, topic)
    read, produce_sets = BrokerConnection.read_set_reply, BrokerConnection.produce_sets
    lost = {"direct": 0, "rounds": 0}
    calls = {"direct": 0, "rounds": 0}

    def read_set_reply(self, correlation_id):
        calls["direct"] += 1
        if calls["direct"] % 5 == 0 and lost["direct"] < 6:
            lost["direct"] += 1
            self.close()
            raise BrokerUnavailableError("injected: the reply of a direct round was lost")
        return read(self, correlation_id)

    def lossy_produce_sets(self, *args, **kwargs):
        results = produce_sets(self, *args, **kwargs)  # stored (the replies were read)
        calls["rounds"] += 1
        if calls["rounds"] % 4 == 0 and lost["rounds"] < 6:
            lost["rounds"] += 1
            self.close()
            raise BrokerUnavailableError("injected: the replies of a round were lost")
        return results

    monkeypatch.setattr(BrokerConnection, "read_set_reply", read_set_reply)
    monkeypatch.setattr(BrokerConnection, "produce_sets", lossy_produce_sets)
    expected, waited, futures = [], [], []
    for i in range(80):
        value = b"d%d" % i
        future = producer.send(topic, value)
        expected.append(value)
        futures.append(future)
        if i % 2 == 0:  # the next send finds the partition idle, or the calls below queued
            waited.append(future.result(timeout_s=WAIT_S).offset)
        if i % 4 == 0:
            values = [b"b%d-%d" % (i, j) for j in range(3)]
            producer.send_batch(topic, values)
            expected += values
        elif i % 4 == 3:
            values = [b"m%d-%d" % (i, j) for j in range(2)]
            producer.send_many(topic, values)
            expected += values
    producer.flush()
    offsets = [f.result(timeout_s=WAIT_S).offset for f in futures]
    assert lost["direct"] >= 1 and lost["rounds"] >= 1, (lost, calls)  # both paths lost replies
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert waited == offsets[::2]
    stored = _read_until(raylog_client, topic, 1 + len(expected))
    time.sleep(0.3)  # (a duplicate stored late would show now)
    stored = _read(raylog_client, topic)
    assert [v for _, v in stored] == [b"warm-up"] + expected  # each once, in the order sent
    by_value = {v: o for o, v in stored}
    assert [by_value[b"d%d" % i] for i in range(80)] == offsets
    assert producer.stats()["failed_messages"] == 0
    producer.close()
