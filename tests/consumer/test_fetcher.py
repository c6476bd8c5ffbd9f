"""A consumer and its fetchers look a partition's endpoint up again after an
error that says so (``refresh_metadata``), against real partition actors:
the client's cached endpoint points at another partition's data server,
which answers NotOwnerError."""

from __future__ import annotations

import queue
import time

import pytest

from raylog.consumer import Consumer
from raylog.consumer.fetcher import Fetcher, FetchSettings
from raylog.errors import NotOwnerError
from raylog.metadata import Metadata

pytestmark = pytest.mark.timeout(180)


def _two_partitions(client, make_topic) -> tuple[str, list[bytes]]:
    import ray

    topic = make_topic(partitions=2)
    values = [b"p0-%03d" % i for i in range(20)]
    producer = client.producer(acks=1)
    for v in values:
        producer.send(topic, v, partition=0)
    producer.send(topic, b"p1", partition=1)
    producer.close()
    for p in range(2):
        ray.get(client.partition_actor(topic, p).flush.remote())
    return topic, values


def _stale_metadata(client, topic: str) -> Metadata:
    """A metadata view whose cached endpoint of partition 0 is partition 1's."""
    metadata = Metadata(client.registry, client.settings)
    wrong = metadata.endpoint(topic, 1, refresh=True, wait_s=10.0)
    assert wrong != metadata.endpoint(topic, 0, refresh=True, wait_s=10.0)
    metadata._endpoints[(topic, 0)] = wrong  # noqa: SLF001 - the stale cache under test
    return metadata


def test_the_stale_endpoint_answers_not_owner(raylog_client, make_topic):
    """The premise of the tests below: the cached endpoint is wrong."""
    from raylog.transfer.connection import BrokerConnection

    topic, _ = _two_partitions(raylog_client, make_topic)
    host, port = _stale_metadata(raylog_client, topic).endpoint(topic, 0)
    with BrokerConnection(host, port, token=raylog_client.settings.token, timeout_s=10) as conn:
        with pytest.raises(NotOwnerError) as info:
            conn.offsets(topic, 0)
    assert info.value.refresh_metadata


def test_consumer_offsets_look_the_endpoint_up_again_after_not_owner(raylog_client, make_topic):
    topic, values = _two_partitions(raylog_client, make_topic)
    metadata = _stale_metadata(raylog_client, topic)
    consumer = Consumer(metadata, topic, auto_offset_reset="earliest", request_timeout_s=10.0)
    try:
        # Resolving partition 0's start asked partition 1's server first.
        assert consumer.offsets((topic, 0)) == raylog_client.offsets(topic, 0)
        got = []
        deadline = time.monotonic() + 30
        while len(got) < len(values) + 1:
            assert time.monotonic() < deadline, f"only {len(got)} messages within 30 s"
            got += consumer.poll(timeout_ms=200)
        assert [m.value for m in got if m.partition == 0] == values
    finally:
        consumer.close()


def test_a_fetcher_looks_the_endpoint_up_again_after_not_owner(raylog_client, make_topic):
    topic, values = _two_partitions(raylog_client, make_topic)
    metadata = _stale_metadata(raylog_client, topic)
    # The fetcher is given what it uses, no consumer.
    chunks = queue.Queue(maxsize=16)
    settings = FetchSettings(fetch_max_wait_ms=100, request_timeout_s=10.0, auto_offset_reset="earliest")
    fetcher = Fetcher((topic, 0), 0, epoch=1, settings=settings, metadata=metadata, put=chunks.put,
                      committed=lambda tp: None, offsets=lambda tp: (0, 0))  # a known position: no lookup first
    fetcher.start()
    try:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < len(values):
            assert time.monotonic() < deadline, f"only {len(got)} messages within 30 s"
            try:
                chunk = chunks.get(timeout=0.2)
            except queue.Empty:
                continue
            assert chunk.error is None, chunk.error
            got += chunk.records
        assert [m.value for m in got] == values
    finally:
        fetcher.stop()
        fetcher.join(timeout=10)
