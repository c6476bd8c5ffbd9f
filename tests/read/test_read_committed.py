"""Ray Data reads of a topic written in transactions (docs/design.md §6;
issue 47, "every reader"), on real Ray and a real ZooKeeper: with
``isolation_level="read_committed"`` ``read_raylog`` returns the committed
and plain records alone, up to the last stable offset (an open
transaction's records and everything after its first one wait); by default
(read_uncommitted) every record but the markers."""

from __future__ import annotations

import pyarrow as pa
import pytest

from raylog.errors import ConfigError, OffsetOutOfRangeError
from raylog.read import plan_read, read_raylog

pytestmark = pytest.mark.timeout(600)

WAIT_S = 60


@pytest.fixture(scope="module", autouse=True)
def coordinator_stopped_after(raylog_client):
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    yield
    stop_transaction_coordinator(raylog_client.settings.cluster)


def _values(client, topic: str, **options) -> dict:
    import ray

    tables = [t for t in ray.get(read_raylog(topic, client=client, **options).to_arrow_refs()) if t.num_rows]
    if not tables:
        return {}
    rows = pa.concat_tables(tables).select(["partition", "offset", "value"]).to_pylist()
    out: dict = {}
    for row in sorted(rows, key=lambda r: (r["partition"], r["offset"])):
        out.setdefault(row["partition"], []).append(bytes(row["value"]))
    return out


def test_read_committed_drops_aborted_records_and_stops_at_an_open_transaction(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    plain = raylog_client.producer(linger_ms=1)
    txn = raylog_client.producer(transactional_id=f"{topic}-writer", linger_ms=1)
    parts = (0, 1)

    def write(producer, name):
        for p in parts:
            producer.send(topic, f"{name}-{p}".encode(), partition=p)
        producer.flush(WAIT_S)

    try:
        write(plain, "p0")
        txn.begin_transaction()
        write(txn, "c1")
        txn.commit_transaction()
        txn.begin_transaction()
        write(txn, "a2")
        txn.abort_transaction()
        write(plain, "p1")
        expected = {p: [f"{v}-{p}".encode() for v in ("p0", "c1", "p1")] for p in parts}
        assert _values(raylog_client, topic, isolation_level="read_committed") == expected
        everything = {p: [f"{v}-{p}".encode() for v in ("p0", "c1", "a2", "p1")] for p in parts}
        assert _values(raylog_client, topic) == everything

        # an open transaction: read_committed ends at its first record (the last stable offset)
        txn.begin_transaction()
        write(txn, "o3")
        write(plain, "p2")
        assert _values(raylog_client, topic, isolation_level="read_committed") == expected
        plan = plan_read(topic, client=raylog_client, isolation_level="read_committed")
        assert all(plan.end_offsets[p] < plan.high_watermarks[p] for p in parts)
        with pytest.raises(OffsetOutOfRangeError, match="last stable offset"):
            plan_read(topic, ending_offsets={0: plan.high_watermarks[0]}, client=raylog_client,
                      isolation_level="read_committed")
        txn.commit_transaction()
        done = {p: expected[p] + [f"o3-{p}".encode(), f"p2-{p}".encode()] for p in parts}
        assert _values(raylog_client, topic, isolation_level="read_committed") == done
    finally:
        txn.close()
        plain.close()


def test_an_unknown_isolation_level_is_refused(raylog_client, make_topic):
    topic = make_topic()
    with pytest.raises(ConfigError, match="isolation_level must be one of"):
        read_raylog(topic, client=raylog_client, isolation_level="committed")
