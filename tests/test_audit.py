"""Audit: produced vs consumed per time window; an injected loss is named."""

from __future__ import annotations

import json

import pytest

from raylog.audit import AUDIT_TOPIC, AuditCounter, audit_report

WINDOW_MS = 1000
A = 10_000  # a window start
B = 20_000  # a later window


def _event(kind, topic, window, count, group=None):
    return json.dumps(
        {"kind": kind, "source": "s", "group": group, "topic": topic, "window_start": window,
         "window_ms": WINDOW_MS, "count": count, "sent_at": 0}
    ).encode()


# -- pure logic ------------------------------------------------------------------


def test_report_flags_only_short_windows():
    events = [
        _event("produced", "t", A, 5),
        _event("produced", "t", A, 5),
        _event("produced", "t", B, 3),
        _event("consumed", "t", A, 7, "g"),
        _event("consumed", "t", B, 4, "g"),  # re-deliveries are not a loss
        _event("produced", "other", A, 1),
    ]
    rows = audit_report(events, topic="t", group="g")
    assert [(r["window_start"], r["produced"], r["consumed"]["g"], r["short"]) for r in rows] == [
        (A, 10, 7, ["g"]),
        (B, 3, 4, []),
    ]


def test_counter_windows_by_timestamp_and_skips_audit_events():
    counter = AuditCounter(WINDOW_MS)
    counter.add_timestamps("t", [A, A + 999, B + 1])
    counter.add("t", B, 2)
    counter.add(AUDIT_TOPIC, A, 5)
    assert counter.take() == {("t", A): 2, ("t", B): 3}
    assert counter.take() == {}


# -- end to end ----------------------------------------------------------------------


def _produce_windows(client, topic, sets_a: int, sets_b: int) -> None:
    producer = client.producer(batch_size=10, acks=1, audit=True, audit_window_ms=WINDOW_MS, audit_interval_ms=60_000)
    for window, sets in ((A, sets_a), (B, sets_b)):
        for i in range(sets * 10):
            producer.send(topic, b"x" * 100, timestamp_ms=window + i % WINDOW_MS)
        producer.flush()  # one set of 10 per batch, windows in separate sets
    producer.close()


def _consume_all(client, topic, group, expect: int) -> int:
    consumer = client.consumer(
        topic, group=group, auto_offset_reset="earliest", audit=True, audit_window_ms=WINDOW_MS,
        session_timeout_ms=4000,
    )
    got = 0
    idle = 0
    while idle < 6 and got < expect:
        batch = consumer.poll(timeout_ms=500)
        got += len(batch)
        idle = 0 if batch else idle + 1
    consumer.close()  # publishes the last counts
    return got


def test_audit_matches_when_nothing_is_lost(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    _produce_windows(raylog_client, topic, sets_a=5, sets_b=3)
    assert _consume_all(raylog_client, topic, "audited", 80) == 80
    rows = raylog_client.audit(topic=topic, group="audited")
    assert [(r["window_start"], r["produced"], r["consumed"]["audited"], r["short"]) for r in rows] == [
        (A, 50, 50, []),
        (B, 30, 30, []),
    ]


def test_audit_names_the_window_whose_data_was_removed(raylog_client, make_topic):
    import ray

    # Sets of 10 x 122 bytes; 3 sets fill a segment. Window A: 10 sets, window B: 3.
    topic = make_topic(partitions=1, segment_bytes=4096, retention_bytes=8192, max_message_bytes=4096)
    _produce_windows(raylog_client, topic, sets_a=10, sets_b=3)
    actor = raylog_client.partition_actor(topic, 0)
    ray.get(actor.flush.remote())
    deleted = ray.get(actor.delete_old_segments.remote())  # the injected loss
    assert deleted, "retention removed nothing"

    got = _consume_all(raylog_client, topic, "late-readers", 130)
    assert got < 130, (deleted, got)
    rows = {r["window_start"]: r for r in raylog_client.audit(topic=topic, group="late-readers")}
    assert rows[A]["produced"] == 100 and rows[A]["short"] == ["late-readers"]
    assert rows[A]["consumed"]["late-readers"] < 100
    assert rows[B]["produced"] == 30 and rows[B]["consumed"]["late-readers"] == 30 and rows[B]["short"] == []


def test_no_audit_topic_means_an_empty_report(zookeeper, ray_local, cluster_name, tmp_path):
    import raylog

    client = raylog.Client(zookeeper=zookeeper.connect_string, cluster=cluster_name, data_dir=str(tmp_path))
    try:
        assert client.audit() == []
    finally:
        client.close()


@pytest.mark.parametrize("window_ms", [1, 60_000])
def test_window_width_is_reported(window_ms):
    counter = AuditCounter(window_ms)
    counter.add("t", 123_456, 1)
    event = json.loads(counter.events("produced", "p")[0])
    assert event["window_ms"] == window_ms and event["window_start"] == 123_456 - 123_456 % window_ms


def test_an_auditing_consumer_is_handed_its_publisher():
    """The consumer sits beside the producer: it publishes its audit events
    through the raylog.audit.AuditPublisher it is handed, and refuses to
    audit without one (before it asks the cluster anything)."""
    from raylog.consumer import Consumer
    from raylog.errors import ConfigError

    with pytest.raises(ConfigError, match="audit_publisher"):
        Consumer(None, "clicks", audit=True)
