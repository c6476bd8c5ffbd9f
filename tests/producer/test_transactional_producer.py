"""Transactions end to end through raylog's own producer, on real Ray and a
real ZooKeeper: the coordinator started by the client's factory, batches
flagged transactional, the partition actors' markers, the group offsets
committed with the transaction, fencing and the timeout abort."""

from __future__ import annotations

import glob
import os
import time

import pytest

from raylog.errors import (
    ConfigError,
    DeliveryError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from raylog.groups.offsets import OffsetStore
from raylog.storage.markers import decode_marker
from raylog.storage.record_batch import decode_batch, iter_batches

pytestmark = pytest.mark.timeout(600)


def _log_batches(client, topic: str, partition: int) -> list[tuple]:
    """``(kind, producer_id, epoch, values or commit)`` of each batch in the
    partition's segment files, in offset order; kind is "data" or "marker"."""
    import ray

    ray.get(client.partition_actor(topic, partition).flush.remote())
    out = []
    for path in sorted(glob.glob(os.path.join(client.log_dir(topic, partition), "*.log"))):
        with open(path, "rb") as f:
            data = f.read()
        for pos, header in iter_batches(data):
            if header.control:
                out.append(("marker", header.producer_id, header.producer_epoch, decode_marker(data, pos).commit))
            else:
                values = [r.value for r in decode_batch(data, pos).records]
                out.append(("data", header.producer_id, header.producer_epoch, header.transactional, values))
    return out


@pytest.fixture(scope="module", autouse=True)
def coordinator_stopped_after(raylog_client):
    """The module's cluster's coordinator (started by the factory) is stopped at the end."""
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    yield
    stop_transaction_coordinator(raylog_client.settings.cluster)


@pytest.fixture
def offsets(raylog_client, make_zk):
    """The committed offsets of the module's cluster, read from ZooKeeper."""
    from raylog import auth

    cluster = raylog_client.settings.cluster
    return OffsetStore(make_zk(token=auth.cluster_token(cluster), cluster=cluster), cluster)


def test_a_transaction_over_three_partitions_of_two_topics_commits_with_its_offsets(raylog_client, make_topic,
                                                                                     offsets):
    import ray

    a, b = make_topic(2), make_topic(1)
    producer = raylog_client.producer(transactional_id="txn-commit", linger_ms=1)
    try:
        pid, epoch = producer.transaction.producer_id, producer.transaction.epoch
        producer.begin_transaction()
        futures = [producer.send(a, b"a0", partition=0), producer.send(a, b"a1", partition=1),
                   producer.send(b, b"b0", partition=0)]
        producer.send_offsets_to_transaction({("in", 0): 42, ("in", 1): 7}, "g-commit")
        assert offsets.committed_all("g-commit") == {}  # not before the commit
        producer.commit_transaction()
        assert [f.result()[0] for f in futures] == [0, 1, 0]
    finally:
        producer.close()

    for topic, partition, value in ((a, 0, b"a0"), (a, 1, b"a1"), (b, 0, b"b0")):
        assert _log_batches(raylog_client, topic, partition) == [
            ("data", pid, epoch, True, [value]),
            ("marker", pid, epoch + 1, True),
        ], f"{topic}-{partition}"
    record = ray.get(raylog_client.transaction_coordinator().describe.remote("txn-commit"))
    assert record["state"] == "CompleteCommit"
    assert offsets.committed_all("g-commit") == {("in", 0): 42, ("in", 1): 7}


def test_an_abort_leaves_abort_markers_and_no_offsets_and_the_next_transaction_commits(raylog_client, make_topic,
                                                                                       offsets):
    import ray

    topic = make_topic(1)
    producer = raylog_client.producer(transactional_id="txn-abort", linger_ms=1)
    try:
        pid, epoch = producer.transaction.producer_id, producer.transaction.epoch
        producer.begin_transaction()
        producer.send(topic, b"gone", partition=0)
        producer.send_offsets_to_transaction({("in", 0): 5}, "g-abort")
        producer.abort_transaction()
        assert ray.get(raylog_client.transaction_coordinator().describe.remote("txn-abort"))["state"] == \
            "CompleteAbort"
        # the next transaction runs under the epoch the abort bumped, its sequences from 0
        producer.begin_transaction()
        producer.send(topic, b"kept", partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    assert _log_batches(raylog_client, topic, 0) == [
        ("data", pid, epoch, True, [b"gone"]),
        ("marker", pid, epoch + 1, False),
        ("data", pid, epoch + 1, True, [b"kept"]),
        ("marker", pid, epoch + 2, True),
    ]
    assert offsets.committed_all("g-abort") == {}


def test_a_second_producer_of_the_transactional_id_fences_the_first(raylog_client, make_topic, offsets):
    import ray

    topic = make_topic(2)
    first = raylog_client.producer(transactional_id="txn-fence", linger_ms=1)
    second = None
    try:
        pid, epoch = first.transaction.producer_id, first.transaction.epoch
        first.begin_transaction()
        first.send(topic, b"zombie-before", partition=0).result()
        second = raylog_client.producer(transactional_id="txn-fence", linger_ms=1)  # fences the first
        # the first's next send to a new partition is refused by the coordinator
        future = first.send(topic, b"zombie-after", partition=1)
        with pytest.raises(ProducerFencedError):
            future.result()
        with pytest.raises(ProducerFencedError):
            first.commit_transaction()
        with pytest.raises(ProducerFencedError):
            first.send(topic, b"again", partition=0)
        with pytest.raises(ProducerFencedError):
            first.send_offsets_to_transaction({("in", 0): 1}, "g-fence")
        with pytest.raises(ProducerFencedError):
            first.begin_transaction()

        second.begin_transaction()
        second.send(topic, b"new", partition=0)
        second.commit_transaction()
    finally:
        try:
            first.close()
        except DeliveryError:
            pass  # its fenced send
        if second is not None:
            second.close()
    batches = _log_batches(raylog_client, topic, 0)
    # the zombie's batch was aborted when the second producer started; nothing of it is committed
    assert batches[:2] == [("data", pid, epoch, True, [b"zombie-before"]), ("marker", pid, epoch + 1, False)]
    assert [b for b in batches[2:] if b[0] == "data"] == [("data", pid, epoch + 2, True, [b"new"])]
    assert batches[-1] == ("marker", pid, epoch + 3, True)
    assert _log_batches(raylog_client, topic, 1) == []
    assert ray.get(raylog_client.transaction_coordinator().describe.remote("txn-fence"))["state"] == \
        "CompleteCommit"
    assert offsets.committed_all("g-fence") == {}


def test_a_transaction_past_its_timeout_is_aborted_and_its_commit_fails(raylog_client, make_topic, offsets):
    import ray

    topic = make_topic(1)
    producer = raylog_client.producer(transactional_id="txn-timeout", transaction_timeout_ms=1000, linger_ms=1)
    try:
        pid, epoch = producer.transaction.producer_id, producer.transaction.epoch
        producer.begin_transaction()
        producer.send(topic, b"late", partition=0).result()
        producer.send_offsets_to_transaction({("in", 0): 9}, "g-timeout")
        coordinator = raylog_client.transaction_coordinator()
        deadline = time.monotonic() + 60
        while ray.get(coordinator.describe.remote("txn-timeout"))["state"] != "CompleteAbort":
            assert time.monotonic() < deadline, "the coordinator did not abort the transaction past its timeout"
            time.sleep(0.2)
        with pytest.raises(InvalidProducerEpochError, match="timeout"):
            producer.commit_transaction()
        with pytest.raises(InvalidProducerEpochError):  # done for good: a new producer is needed
            producer.begin_transaction()
    finally:
        producer.close()
    assert _log_batches(raylog_client, topic, 0) == [
        ("data", pid, epoch, True, [b"late"]),
        ("marker", pid, epoch + 1, False),
    ]
    assert offsets.committed_all("g-timeout") == {}


def test_transactional_misuse_is_refused_with_typed_errors_and_loses_nothing(raylog_client, make_topic):
    topic = make_topic(1)
    with pytest.raises(ConfigError, match="acks='all'"):
        raylog_client.producer(transactional_id="txn-misuse", acks=1)
    with pytest.raises(ConfigError, match="enable_idempotence"):
        raylog_client.producer(transactional_id="txn-misuse", enable_idempotence=False)
    producer = raylog_client.producer(transactional_id="txn-misuse", linger_ms=1)
    try:
        with pytest.raises(InvalidTxnStateError, match="begin_transaction"):
            producer.send(topic, b"outside")
        with pytest.raises(InvalidTxnStateError, match="begin_transaction"):
            producer.send_batch(topic, [b"outside"])
        with pytest.raises(InvalidTxnStateError):
            producer.commit_transaction()
        producer.begin_transaction()
        with pytest.raises(InvalidTxnStateError, match="open already"):
            producer.begin_transaction()
        producer.send(topic, b"inside", partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    plain = raylog_client.producer(acks="all")
    try:
        with pytest.raises(InvalidTxnStateError, match="not transactional"):
            plain.begin_transaction()
    finally:
        plain.close()
    assert [b[4] for b in _log_batches(raylog_client, topic, 0) if b[0] == "data"] == [[b"inside"]]


def test_the_producer_actor_runs_transactions(raylog_client, make_topic):
    import ray

    topic = make_topic(1)
    handle = raylog_client.producer_actor(transactional_id="txn-actor", linger_ms=1)
    ray.get(handle.begin_transaction.remote())
    ray.get(handle.send.remote(topic, b"one", partition=0))
    ray.get(handle.commit_transaction.remote())
    ray.get(handle.begin_transaction.remote())
    ray.get(handle.send.remote(topic, b"two", partition=0))
    ray.get(handle.abort_transaction.remote())
    ray.get(handle.close.remote())
    kinds = [(b[0], b[4] if b[0] == "data" else b[3]) for b in _log_batches(raylog_client, topic, 0)]
    assert kinds == [("data", [b"one"]), ("marker", True), ("data", [b"two"]), ("marker", False)]


def test_a_read_uncommitted_consumer_hands_out_no_marker(raylog_client, make_topic):
    """Markers are control batches: a consumer (read_uncommitted, the only
    level it has yet) skips them and hands out every data record, the
    aborted ones included, at their offsets."""
    topic = make_topic(1)
    producer = raylog_client.producer(transactional_id="txn-read", linger_ms=1)
    try:
        producer.begin_transaction()
        first = producer.send(topic, b"committed", partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        second = producer.send(topic, b"aborted", partition=0)
        producer.abort_transaction()
        producer.begin_transaction()
        third = producer.send(topic, b"last", partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        got, deadline = [], time.monotonic() + 60
        while len(got) < 3 and time.monotonic() < deadline:
            got += consumer.poll(500)
        got += consumer.poll(1000)  # nothing more: no control record comes out
    finally:
        consumer.close()
    assert [(m.offset, m.value) for m in got] == [
        (first.result()[1], b"committed"), (second.result()[1], b"aborted"), (third.result()[1], b"last")]


def test_write_marker_refuses_older_epochs_with_typed_errors_and_writes_nothing(raylog_client, make_topic):
    import ray

    from raylog.errors import TransactionCoordinatorFencedError

    topic = make_topic(1)
    actor = raylog_client.partition_actor(topic, 0)
    assert ray.get(actor.write_marker.remote(77, 3, True, 5)) == 0
    with pytest.raises(InvalidProducerEpochError):
        ray.get(actor.write_marker.remote(77, 2, False, 5))
    with pytest.raises(TransactionCoordinatorFencedError):
        ray.get(actor.write_marker.remote(77, 3, False, 4))
    assert _log_batches(raylog_client, topic, 0) == [("marker", 77, 3, True)]
    stats = ray.get(actor.stats.remote())  # below the high watermark: stored as acks="all" is
    assert stats["high_watermark"] == stats["log_end_offset"] > 0
