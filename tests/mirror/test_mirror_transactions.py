"""A mirror of a topic written in transactions (docs/design.md §9 and §6;
issue 47, "every reader"), on real Ray and ZooKeeper: the mirror copies
the records of committed transactions and plain writes (as plain records),
never those of aborted transactions nor the markers, and waits at an open
transaction until it ends."""

from __future__ import annotations

import time
import uuid

import pytest

pytestmark = pytest.mark.timeout(600)

WAIT_S = 60


def _read(client, topic: str, partitions: int, until: int) -> dict[int, list[bytes]]:
    """The values of every partition, in order, once ``until`` values are read (or the wait ends)."""
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        deadline = time.monotonic() + WAIT_S
        while sum(map(len, out.values())) < until and time.monotonic() < deadline:
            for m in consumer.poll(timeout_ms=300):
                out[m.partition].append(m.value)
        for m in consumer.poll(timeout_ms=1000):  # nothing more comes
            out[m.partition].append(m.value)
    finally:
        consumer.close()
    return out


@pytest.fixture(autouse=True)
def coordinator_stopped_after(source):
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    yield
    stop_transaction_coordinator(source.settings.cluster)


def test_a_mirror_copies_committed_transactions_and_never_aborted_ones(raylog_client, source):
    tag = uuid.uuid4().hex[:6]
    topic = f"txn-{tag}"
    source.create_topic(topic, partitions=2)
    plain = source.producer(linger_ms=1)
    txn = source.producer(transactional_id=f"mirror-test-{tag}", linger_ms=1)

    def write(producer, name):
        for p in (0, 1):
            producer.send(topic, f"{name}-{p}".encode(), partition=p)
        producer.flush(WAIT_S)

    handle = raylog_client.mirror(source_zookeeper=source.settings.zookeeper,
                                  source_cluster=source.settings.cluster, topics=topic, name=f"mt-{tag}",
                                  members=1, scan_interval_s=1.0)
    try:
        write(plain, "p0")
        txn.begin_transaction()
        write(txn, "c1")
        txn.commit_transaction()
        txn.begin_transaction()
        write(txn, "a2")
        txn.abort_transaction()
        write(plain, "p1")
        txn.begin_transaction()
        write(txn, "o3")  # open while the mirror copies: it waits there
        write(plain, "p2")
        expected = {p: [f"{v}-{p}".encode() for v in ("p0", "c1", "p1")] for p in (0, 1)}
        assert _read(raylog_client, topic, 2, 6) == expected
        txn.commit_transaction()
        expected = {p: expected[p] + [f"o3-{p}".encode(), f"p2-{p}".encode()] for p in (0, 1)}
        assert _read(raylog_client, topic, 2, 10) == expected
    finally:
        handle.stop()
        txn.close()
        plain.close()
