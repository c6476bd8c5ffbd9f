"""read_committed consumers (docs/design.md §6) on real Ray and a real
ZooKeeper: committed and aborted transactions of raylog's transactional
producer interleaved with plain writes over two partitions; an open
transaction holds read_committed readers at the last stable offset until it
commits (then they get it) or aborts (then they skip it); read_uncommitted
gets every record but the markers."""

from __future__ import annotations

import time

import pytest

from raylog.errors import ConfigError

pytestmark = pytest.mark.timeout(600)

WAIT_S = 60


@pytest.fixture(scope="module", autouse=True)
def coordinator_stopped_after(raylog_client):
    """The module's cluster's coordinator (started by the factory) is stopped at the end."""
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    yield
    stop_transaction_coordinator(raylog_client.settings.cluster)


def write_history(client, topic: str, transactional_id: str) -> dict:
    """Plain writes and transactions (committed, aborted, and one still open
    while a plain write lands after its first batch) on partitions 0 and 1
    of ``topic``; ``{"committed": [...], "uncommitted": [...]}``: the values
    each isolation level hands out, per partition in offset order."""
    plain = client.producer(linger_ms=1)
    txn = client.producer(transactional_id=transactional_id, linger_ms=1)
    parts = (0, 1)

    def plain_write(name):
        for p in parts:
            plain.send(topic, f"{name}-{p}".encode(), partition=p)
        plain.flush(WAIT_S)

    def txn_write(name):
        for p in parts:
            txn.send(topic, f"{name}-{p}".encode(), partition=p)

    try:
        plain_write("p0")
        txn.begin_transaction()
        txn_write("c1")
        txn.commit_transaction()
        plain_write("p1")
        txn.begin_transaction()
        txn_write("a2")
        txn.abort_transaction()
        plain_write("p2")
        txn.begin_transaction()
        txn_write("c3")
        txn.flush(WAIT_S)
        plain_write("p3")  # after the open transaction's first batch
        txn.commit_transaction()
        txn.begin_transaction()
        txn_write("a4")
        txn.flush(WAIT_S)
        plain_write("p4")
        txn.abort_transaction()
        plain_write("p5")
    finally:
        txn.close()
        plain.close()
    committed = ["p0", "c1", "p1", "p2", "c3", "p3", "p4", "p5"]
    uncommitted = ["p0", "c1", "p1", "a2", "p2", "c3", "p3", "a4", "p4", "p5"]
    return {
        "committed": {p: [f"{v}-{p}".encode() for v in committed] for p in parts},
        "uncommitted": {p: [f"{v}-{p}".encode() for v in uncommitted] for p in parts},
    }


def poll_until(consumer, count: int, timeout_s: float = WAIT_S, settle_ms: int = 1000) -> list:
    """Poll until ``count`` messages came (or the time is up), then once more
    for ``settle_ms``: nothing beyond them may come."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(500)
    got += consumer.poll(settle_ms)
    return got


def by_partition(messages) -> dict:
    out: dict[int, list] = {}
    for m in messages:
        out.setdefault(m.partition, []).append(m)
    for ms in out.values():
        assert [m.offset for m in ms] == sorted(m.offset for m in ms), "offset order"
    return {p: [m.value for m in ms] for p, ms in out.items()}


def test_an_unknown_isolation_level_is_a_config_error(raylog_client, make_topic):
    topic = make_topic(1)
    with pytest.raises(ConfigError, match="isolation_level"):
        raylog_client.consumer(topic, isolation_level="committed")
    with raylog_client.producer() as producer:  # the topic is unharmed
        producer.send(topic, b"kept", partition=0)
        producer.flush(WAIT_S)
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest", isolation_level="read_committed")
    try:
        assert [m.value for m in poll_until(consumer, 1, settle_ms=200)] == [b"kept"]
    finally:
        consumer.close()


def test_read_committed_gets_the_committed_and_plain_records_and_read_uncommitted_everything(raylog_client,
                                                                                             make_topic):
    """Seen red before the fix: the consumer had no isolation_level, and
    read every aborted record."""
    topic = make_topic(2)
    expected = write_history(raylog_client, topic, "rc-history")
    for level in ("committed", "uncommitted"):
        consumer = raylog_client.consumer(topic, auto_offset_reset="earliest", isolation_level=f"read_{level}")
        try:
            got = poll_until(consumer, sum(map(len, expected[level].values())))
        finally:
            consumer.close()
        assert by_partition(got) == expected[level], level


def test_an_open_transaction_holds_read_committed_readers_until_it_ends(raylog_client, make_topic):
    """Seen red before the fix: the reader got the open transaction's
    records and the plain ones after it at once."""
    topic = make_topic(2)
    plain = raylog_client.producer(linger_ms=1)
    txn = raylog_client.producer(transactional_id="rc-open", linger_ms=1)
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest", isolation_level="read_committed")
    everything = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        for p in (0, 1):
            plain.send(topic, b"q0", partition=p)
        plain.flush(WAIT_S)
        txn.begin_transaction()
        for p in (0, 1):
            txn.send(topic, b"open", partition=p)
        txn.flush(WAIT_S)
        for p in (0, 1):
            plain.send(topic, b"q1", partition=p)
        plain.flush(WAIT_S)
        assert by_partition(poll_until(consumer, 2, settle_ms=2000)) == {0: [b"q0"], 1: [b"q0"]}
        assert by_partition(poll_until(everything, 6)) == {p: [b"q0", b"open", b"q1"] for p in (0, 1)}
        txn.commit_transaction()  # the held reader gets it, then what was behind it
        assert by_partition(poll_until(consumer, 4)) == {p: [b"open", b"q1"] for p in (0, 1)}

        txn.begin_transaction()
        for p in (0, 1):
            txn.send(topic, b"doomed", partition=p)
        txn.flush(WAIT_S)
        for p in (0, 1):
            plain.send(topic, b"q2", partition=p)
        plain.flush(WAIT_S)
        assert consumer.poll(2000) == []  # held at the last stable offset
        txn.abort_transaction()  # the held reader skips it
        assert by_partition(poll_until(consumer, 2)) == {p: [b"q2"] for p in (0, 1)}
        assert by_partition(poll_until(everything, 4)) == {p: [b"doomed", b"q2"] for p in (0, 1)}
    finally:
        consumer.close()
        everything.close()
        txn.close()
        plain.close()


def test_latest_for_read_committed_is_the_last_stable_offset(raylog_client, make_topic):
    """Seen red before the fix: "latest" was the high watermark, past the
    open transaction, whose records the reader then never got."""
    topic = make_topic(1)
    plain = raylog_client.producer(linger_ms=1)
    txn = raylog_client.producer(transactional_id="rc-latest", linger_ms=1)
    try:
        plain.send(topic, b"q0", partition=0)
        plain.flush(WAIT_S)
        txn.begin_transaction()
        opened = txn.send(topic, b"open", partition=0)
        txn.flush(WAIT_S)
        plain.send(topic, b"q1", partition=0)
        plain.flush(WAIT_S)
        consumer = raylog_client.consumer(topic, auto_offset_reset="latest", isolation_level="read_committed")
        try:
            assert consumer.offsets((topic, 0))[1] == opened.result()[1]
            assert consumer.poll(1000) == []
            txn.commit_transaction()
            assert by_partition(poll_until(consumer, 2)) == {0: [b"open", b"q1"]}
        finally:
            consumer.close()
    finally:
        txn.close()
        plain.close()
