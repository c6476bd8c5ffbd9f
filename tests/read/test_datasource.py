"""read_raylog never waits for good for CPUs that others hold: it runs
without them, or fails at once naming what it needs. The CPUs are held by a
placeholder actor here (as Spark executors would hold them; the same next
to a real RayDP session is in tests/integrations/spark/test_read_beside_spark.py)."""

from __future__ import annotations

import time

import pytest

from raylog.read import read_raylog
from raylog.errors import ConfigError, ResourcesUnavailableError

pytestmark = pytest.mark.timeout(300)
MESSAGES = 50


@pytest.fixture(scope="module")
def filled(raylog_client):
    topic = "resources"
    raylog_client.create_topic(topic, partitions=2, flush_ms=10)
    producer = raylog_client.producer(acks=1, batch_size=10)  # many record batches: a read cuts at their starts
    for i in range(MESSAGES):
        producer.send(topic, b"m%d" % i)
    producer.close()
    deadline = time.monotonic() + 60
    while sum(raylog_client.end_offsets(topic).values()) == 0 or not _flushed(raylog_client, topic):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return topic


def _flushed(client, topic) -> bool:
    import ray

    stats = [ray.get(client.partition_actor(topic, p).stats.remote()) for p in range(2)]
    return all(s["high_watermark"] == s["log_end_offset"] for s in stats)


@pytest.fixture
def every_cpu_held(ray_local):
    """An actor holding every CPU free now (released after the test)."""
    import ray

    free = ray.available_resources().get("CPU", 0)

    @ray.remote
    class Holder:
        def ping(self):
            return True

    holder = Holder.options(num_cpus=free).remote() if free else None
    if holder is not None:
        ray.get(holder.ping.remote(), timeout=120)
    assert ray.available_resources().get("CPU", 0) < 1
    try:
        yield
    finally:
        if holder is not None:
            ray.kill(holder)
            deadline = time.monotonic() + 60  # the CPUs come back a moment later
            while ray.available_resources().get("CPU", 0) < free and time.monotonic() < deadline:
                time.sleep(0.1)


def test_read_raylog_runs_without_a_free_cpu(raylog_client, filled, every_cpu_held):
    ds = read_raylog(filled, client=raylog_client)
    assert ds.count() == MESSAGES  # a hang here is the failure (test timeout)
    assert sorted(ds.to_pandas()["value"]) == sorted(b"m%d" % i for i in range(MESSAGES))


def test_read_raylog_asking_for_cpus_that_are_held_fails_naming_them(raylog_client, filled, every_cpu_held):
    with pytest.raises(ResourcesUnavailableError, match=r"needs 1 free CPU per read task .* 0 free now") as info:
        read_raylog(filled, client=raylog_client, num_cpus=1)
    assert info.value.retriable and info.value.needed_cpus == 1


def test_read_raylog_asking_for_more_cpus_than_a_node_has_is_a_config_error(raylog_client, filled):
    with pytest.raises(ConfigError, match="never fit"):
        read_raylog(filled, client=raylog_client, num_cpus=1000)


def test_read_raylog_with_cpus_free_is_lazy_as_before(raylog_client, filled):
    ds = read_raylog(filled, client=raylog_client)
    assert "Materialized" not in type(ds).__name__
    assert ds.count() == MESSAGES


def test_read_raylog_hands_plan_read_every_planning_keyword():
    """read_raylog forwards PLAN_OPTIONS to plan_read: they must be exactly
    plan_read's keyword-only parameters, or a keyword would go to Ray Data."""
    import inspect

    from raylog.read import PLAN_OPTIONS, plan_read

    keywords = [n for n, p in inspect.signature(plan_read).parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert sorted(PLAN_OPTIONS) == sorted(keywords)


def test_read_raylog_plans_with_its_planning_keywords(raylog_client, filled):
    ds = read_raylog(filled, client=raylog_client, min_partitions=4, fail_on_data_loss=False, num_cpus=0)
    assert ds.count() == MESSAGES
    assert ds.materialize().num_blocks() >= 4
