"""Consumer pools on a real ZooKeeper and a real Ray (the module's
``raylog_client``): members are Ray actors in a real consumer group.

* scaled up and down by hand while a producer writes: nothing lost, order
  kept per partition, and after ``stop(drain=True)`` the group's committed
  offsets are the ends and no actor of the pool is left;
* a member killed mid-batch: the controller replaces it, every message is
  handled at least once, in order;
* a handler that raises a few times is retried and nothing is skipped;
* one that always raises on a partition stops that partition, shows the
  error in ``status()`` and commits nothing past it (and no longer fetches
  it); with a dead-letter topic the failed batches go there, once each, and
  the partition goes on;
* scaling by lag: a burst grows the pool, the drained lag shrinks it;
* a status read while a step down drains shows the new count with its step.
"""

from __future__ import annotations

import os
import threading
import uuid

import pytest

import pool_helpers
import raylog
from pool_helpers import Gated, Recorder, check_at_least_once_in_order, handled, produce
from raylog.testing.clusters import wait_until

#: the pools here take no CPU of the shared test Ray, react fast, and move a dead member's partitions soon
FAST = dict(resources={"num_cpus": 0}, sample_interval_s=0.5, commit_interval_s=0.5, session_timeout_ms=4000,
            poll_timeout_ms=200, retry_delay_s=0.05, retry_max_delay_s=0.2)
#: a bound on each wait, for a loaded machine
WAIT_S = 120.0


@pytest.fixture(autouse=True)
def _handlers_by_value(ray_local):
    pool_helpers.send_by_value()


def _group() -> str:
    return f"pool-{uuid.uuid4().hex[:8]}"


def _owners(pool) -> dict:
    status = pool.status()
    return {m["index"]: m["partitions"] for m in status["members"]}


def _all_handled(path, produced):
    seen = handled(path)
    return all(set(values) <= set(seen.get(p, ())) for p, values in produced.items())


def _actors_gone(handles) -> bool:
    import ray
    from ray.exceptions import RayActorError

    for h in handles:
        try:
            ray.get(h.ping.remote(), timeout=10)
            return False
        except RayActorError:
            continue
    return True


class _MemberView:
    """A pool member as the one-owner watcher samples it: its consumer's id
    and, each time it is read, the partitions it hands out now."""

    def __init__(self, handle):
        import ray

        self.handle = handle
        self.consumer_id = ray.get(handle.stats.remote(), timeout=30)["consumer_id"]
        self.samples = 0  # answers given to the watcher

    @property
    def assignment(self) -> set:
        import ray

        try:
            held = {tuple(tp) for tp in ray.get(self.handle.assignment.remote(), timeout=10)}
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            return set()  # a member the step removed: it hands out nothing
        self.samples += 1
        return held


def _member_views(pool, cache: dict):
    views = []
    for index, handle in pool.members().items():
        if index not in cache or cache[index].handle != handle:
            cache[index] = _MemberView(handle)
        views.append(cache[index])
    return views


def test_scaled_up_and_down_under_load_loses_nothing_and_keeps_order(raylog_client, make_topic, tmp_path,
                                                                      owner_watcher):
    topic, group, path = make_topic(4, flush_ms=20), _group(), str(tmp_path / "handled")
    # no periodic commit within the test: what is committed comes from revocations and the drain
    pool = raylog_client.consumer_pool(topic, group, Recorder(path, sleep_s=0.005), min_members=1, max_members=4,
                                       autoscale=False, **{**FAST, "commit_interval_s": 600.0})
    produced: dict = {}
    writer = threading.Thread(target=lambda: produced.update(
        produce(raylog_client, topic, 3000, 4, pause_every=100, pause_s=0.1)))
    writer.start()
    # The watcher samples the members the test last saw (the controller's
    # member list waits while a step runs; a step down returns once the
    # members it removed have left the group).
    cache: dict = {}
    views = _member_views(pool, cache)
    watcher = owner_watcher(raylog_client.settings.cluster, group, [topic], lambda: list(views), interval_s=0.25)
    try:
        with watcher:  # no partition handed out by two members at once, through every step
            for n in (3, 4, 1, 2):
                assert pool.scale(n) == n
                views = _member_views(pool, cache)
                # each member holds a share: the cooperative rebalance is done
                assert wait_until(lambda: (lambda o: len(o) == n and all(o.values()))(_owners(pool)), WAIT_S,
                                  0.5), _owners(pool)
        assert watcher.rounds >= 10 and all(v.samples for v in views), (watcher.rounds, [v.samples for v in views])
        writer.join(WAIT_S)
        assert not writer.is_alive()
        assert wait_until(lambda: _all_handled(path, produced), WAIT_S, 0.5), pool.status()
        members = list(pool.members().values())
        status = pool.status()
        assert status["member_count"] == 2 and all(not r["stopped"] for r in status["partitions"])
        assert status["running_count"] == 2, status["members"]
    finally:
        pool.stop(drain=True)
    check_at_least_once_in_order(handled(path), produced)
    # the drain committed everything handled: the group is at the end of every partition
    ends = raylog_client.end_offsets(topic)
    committed = {r["partition"]: r["committed"] for r in raylog_client.describe_group(group) if r["topic"] == topic}
    assert committed == ends
    assert _actors_gone(members)
    with pytest.raises(raylog.PoolNotFoundError):
        pool.status()


def test_a_member_killed_mid_batch_is_replaced_and_everything_is_handled(raylog_client, make_topic, tmp_path):
    import ray

    topic, group, path = make_topic(2, flush_ms=20), _group(), str(tmp_path / "handled")
    produced = produce(raylog_client, topic, 600, 2)
    pool = raylog_client.consumer_pool(topic, group, Recorder(path, sleep_s=0.3), min_members=2, max_members=2,
                                       batch_max=50, autoscale=False, **FAST)
    try:
        assert wait_until(lambda: sum(len(v) for v in handled(path).values()) >= 100, WAIT_S, 0.2)
        victim = pool.members()[0]
        ray.kill(victim, no_restart=True)  # mid-batch: each batch takes 0.3 s
        assert wait_until(lambda: any("died" in e["why"] for e in pool.status()["events"]), WAIT_S, 0.5)
        assert wait_until(lambda: _all_handled(path, produced), WAIT_S, 0.5), pool.status()
        status = pool.status()
        assert status["member_count"] == 2 and sum(m["replaced"] for m in status["members"]) == 1
    finally:
        pool.stop(drain=True)
    check_at_least_once_in_order(handled(path), produced)


def test_a_handler_that_raises_a_few_times_is_retried_and_skips_nothing(raylog_client, make_topic, tmp_path):
    topic, group, path = make_topic(2, flush_ms=20), _group(), str(tmp_path / "handled")
    produced = produce(raylog_client, topic, 400, 2)
    pool = raylog_client.consumer_pool(topic, group, Recorder(path, fail_times=3, fail_partition=1), min_members=1,
                                       max_members=1, max_handler_failures=5, autoscale=False, **FAST)
    try:
        assert wait_until(lambda: _all_handled(path, produced), WAIT_S, 0.5), pool.status()
        rows = {r["partition"]: r for r in pool.status()["partitions"]}
        assert rows[1]["errors"] == 3 and not rows[1]["stopped"] and "failure 3 of 3" in rows[1]["last_error"]["error"]
        assert rows[0]["errors"] == 0 and rows[0]["last_error"] is None
    finally:
        pool.stop(drain=True)
    check_at_least_once_in_order(handled(path), produced)


def test_a_handler_that_always_raises_stops_its_partition_and_commits_nothing_past_it(raylog_client, make_topic,
                                                                                        tmp_path):
    topic, group, path = make_topic(2, flush_ms=20), _group(), str(tmp_path / "handled")
    produced = produce(raylog_client, topic, 200, 2)
    first_of_1 = raylog_client.offsets(topic, 1)[0]
    pool = raylog_client.consumer_pool(topic, group, Recorder(path, always_fail=1), min_members=1, max_members=2,
                                       max_handler_failures=3, autoscale=False, **FAST)
    try:
        def stopped():
            rows = {r["partition"]: r for r in pool.status()["partitions"]}
            return rows[1]["stopped"] and rows[0]["committed"] == raylog_client.end_offsets(topic)[0]
        assert wait_until(stopped, WAIT_S, 0.5), pool.status()
        more = produce(raylog_client, topic, 20, 2, start=1000)  # more arrives, for the stopped partition too
        produced[0] += more[0]
        end_0 = raylog_client.end_offsets(topic)[0]
        assert wait_until(lambda: pool.status()["partitions"][0]["committed"] == end_0, WAIT_S, 0.5)
        status = pool.status()
        row = {r["partition"]: r for r in status["partitions"]}[1]
        assert row["last_error"]["failures"] == 3 and row["last_error"]["offset"] == first_of_1
        assert "always fails on partition 1" in row["last_error"]["error"]
        assert row["committed"] is None and row["lag_bytes"] > 0 and row["handled"] == 0
        assert row["fetching"] is False and row["stopped"]  # paused in the member's consumer: not read any more
    finally:
        pool.stop(drain=True)
    assert handled(path).get(1, []) == []
    check_at_least_once_in_order({0: handled(path)[0]}, {0: produced[0]})
    # the drain committed partition 0 and nothing of partition 1
    committed = {r["partition"]: r["committed"] for r in raylog_client.describe_group(group) if r["topic"] == topic}
    assert committed[1] is None and committed[0] == raylog_client.end_offsets(topic)[0]


def test_with_a_dead_letter_topic_a_batch_that_always_fails_is_stored_there_and_the_partition_goes_on(
        raylog_client, make_topic, tmp_path):
    topic, group, path = make_topic(2, flush_ms=20), _group(), str(tmp_path / "handled")
    dead = make_topic(1, flush_ms=20)
    produced = produce(raylog_client, topic, 200, 2)
    pool = raylog_client.consumer_pool(topic, group, Recorder(path, always_fail=1), min_members=1, max_members=2,
                                       max_handler_failures=2, autoscale=False, dead_letter_topic=dead, **FAST)
    try:
        def dead_lettered_all() -> bool:
            rows = {r["partition"]: r for r in pool.status()["partitions"]}
            return (rows[1]["dead_lettered"] == len(produced[1])
                    and rows[1]["committed"] == raylog_client.end_offsets(topic)[1])
        assert wait_until(dead_lettered_all, WAIT_S, 0.5), pool.status()
        row = {r["partition"]: r for r in pool.status()["partitions"]}[1]
        assert not row["stopped"] and row["fetching"] and row["handled"] == 0
        assert "always fails on partition 1" in row["last_error"]["error"]
    finally:
        pool.stop(drain=True)
    assert handled(path).get(1, []) == []
    check_at_least_once_in_order({0: handled(path)[0]}, {0: produced[0]})
    # the dead-letter topic holds partition 1's messages, each once, in order
    consumer = raylog_client.consumer(dead, auto_offset_reset="earliest")
    try:
        consumer.assign([(dead, 0)])
        got = []
        assert wait_until(lambda: got.extend(m.value.decode() for m in consumer.poll(timeout_ms=200)) or
                          len(got) >= len(produced[1]), WAIT_S, 0)
    finally:
        consumer.close()
    assert got == produced[1]


def test_a_burst_grows_the_pool_and_the_drained_lag_shrinks_it(raylog_client, make_topic, tmp_path):
    topic, group, path = make_topic(4, flush_ms=20), _group(), str(tmp_path / "handled")
    pool = raylog_client.consumer_pool(
        topic, group, Recorder(path, sleep_s=0.05), min_members=1, max_members=3, batch_max=20, target_lag_s=2.0,
        low_lag_s=0.5, scale_up_after_s=1.0, scale_down_after_s=3.0, cooldown_s=2.0, **FAST)
    try:
        produced = produce(raylog_client, topic, 2000, 4)  # at 20 per 0.05 s one member needs ~5 s: lag builds
        assert wait_until(lambda: pool.status()["member_count"] >= 2, WAIT_S, 0.5), pool.status()
        assert wait_until(lambda: _all_handled(path, produced), WAIT_S, 0.5), pool.status()
        assert wait_until(lambda: pool.status()["member_count"] == 1, WAIT_S, 0.5), pool.status()
        steps = [(e["from"], e["to"]) for e in pool.status()["events"] if e["why"] != "start"]
        assert any(b > a for a, b in steps) and any(b < a for a, b in steps), steps
    finally:
        pool.stop(drain=True)
    check_at_least_once_in_order(handled(path), produced)


def test_a_status_read_while_a_step_down_drains_shows_the_step_with_the_new_count(raylog_client, make_topic, tmp_path):
    """A step down takes its members out, then waits for them to finish their
    batch, commit and leave. A status read in that wait counts the members
    left; its events must already hold the step that took them out (a status
    counting 1 member whose events end at the step up is a pool that shrank
    for no recorded reason). The leaving member's batch is held open by a
    gate until the read is made, so the read falls inside the drain however
    loaded the machine."""
    topic, group = make_topic(2, flush_ms=20), _group()
    path, gate = str(tmp_path / "handled"), str(tmp_path / "gate")
    pool = raylog_client.consumer_pool(topic, group, Gated(path, gate), min_members=1, max_members=2,
                                       autoscale=False, batch_max=5, **FAST)
    try:
        assert pool.scale(2) == 2
        assert wait_until(lambda: (lambda o: len(o) == 2 and all(o.values()))(_owners(pool)), WAIT_S, 0.5)
        (leaving,) = _owners(pool)[1]  # the step down takes the member of the highest index out
        produce(raylog_client, topic, 20, 2)
        assert wait_until(lambda: os.path.exists(f"{path}.began-{leaving.rsplit('-', 1)[1]}"), WAIT_S, 0.1)
        stepping = threading.Thread(target=pool.scale, args=(1,))
        stepping.start()
        reads = []

        def shrunk() -> bool:
            status = pool.status()
            steps = [(e["from"], e["to"]) for e in status["events"] if e["why"] != "start"]
            reads.append((status["member_count"], stepping.is_alive(), steps))
            return status["member_count"] == 1

        assert wait_until(shrunk, WAIT_S, 0.1), reads
        count, draining, steps = reads[-1]
        assert draining, reads  # the step had not returned: its member was still in the gated batch
        assert steps and steps[-1] == (2, 1), reads
    finally:
        open(gate, "a").close()
        pool.stop(drain=False)
