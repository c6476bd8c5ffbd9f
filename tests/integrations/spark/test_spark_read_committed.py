"""Spark reads of a topic written in transactions (docs/design.md §6; issue
47, "every reader") on real Spark (RayDP), Ray and ZooKeeper:
``raylog_spark.read_topic(..., isolation_level="read_committed")`` gives the
committed and plain records alone (the Python reader; the JVM reader refuses
it by name instead of handing out aborted records), and the source's option
``kafka.isolation.level`` is refused with what to use instead."""

from __future__ import annotations

import pytest

import raylog
import raylog_spark
from raylog.errors import ConfigError

pytestmark = pytest.mark.timeout(600)

WAIT_S = 60


@pytest.fixture(scope="module", autouse=True)
def coordinator_stopped_after(raylog_client):
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    yield
    stop_transaction_coordinator(raylog_client.settings.cluster)


def test_read_topic_read_committed_drops_aborted_records(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain = raylog_client.producer(linger_ms=1)
    txn = raylog_client.producer(transactional_id=f"{topic}-writer", linger_ms=1)
    try:
        plain.send(topic, b"plain-0").result(WAIT_S)
        txn.begin_transaction()
        txn.send(topic, b"committed")
        txn.commit_transaction()
        txn.begin_transaction()
        txn.send(topic, b"aborted")
        txn.flush(WAIT_S)
        txn.abort_transaction()
        plain.send(topic, b"plain-1").result(WAIT_S)
    finally:
        txn.close()
        plain.close()
    df = raylog_spark.read_topic(spark, topic, client=raylog_client, isolation_level="read_committed")
    assert df.raylog_engine == "python"
    assert [bytes(r["value"]) for r in df.orderBy("offset").collect()] == [b"plain-0", b"committed", b"plain-1"]
    every = raylog_spark.read_topic(spark, topic, client=raylog_client)
    assert [bytes(r["value"]) for r in every.orderBy("offset").collect()] == \
        [b"plain-0", b"committed", b"aborted", b"plain-1"]
    with pytest.raises(ConfigError, match="JVM reader does not read read_committed"):
        raylog_spark.read_topic(spark, topic, client=raylog_client, isolation_level="read_committed", engine="jvm")


@pytest.mark.parametrize("name", ["kafka.isolation.level", "isolationLevel"])
def test_the_source_refuses_an_isolation_level_option_by_name(spark, raylog_client, make_topic, name):
    from raylog_spark import jvm

    if not jvm.loadable(spark):
        pytest.skip("the session does not load the raylog data source")
    topic = make_topic()
    df = spark.read.format("raylog").option("subscribe", topic).option(name, "read_committed")
    with pytest.raises(Exception, match="isolation_level='read_committed'"):
        df.load().collect()


def test_the_read_committed_example_runs_as_written(spark, raylog_client):
    """The block of docs/howto/spark.md, "Topics written in transactions", on
    a topic "payments" holding a committed and an aborted transaction."""
    import raylog.read  # noqa: F401 - the block uses raylog.read
    from tests.doc_blocks import block

    raylog_client.create_topic("payments", partitions=1)
    txn = raylog_client.producer(transactional_id="payments-writer", linger_ms=1)
    try:
        for value, commit in ((b"paid", True), (b"refused", False)):
            txn.begin_transaction()
            txn.send("payments", value)
            txn.flush(WAIT_S)
            txn.commit_transaction() if commit else txn.abort_transaction()
    finally:
        txn.close()
    namespace = {"client": raylog_client, "spark": spark, "raylog": raylog, "raylog_spark": raylog_spark}
    exec(compile(block("docs/howto/spark.md", "Topics written in transactions"), "spark.md", "exec"), namespace)
    assert [bytes(v) for v in namespace["ds"].to_pandas()["value"]] == [b"paid"]
    assert [bytes(r["value"]) for r in namespace["df"].collect()] == [b"paid"]
