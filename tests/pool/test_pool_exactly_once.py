"""Exactly-once consumer pools (``output_topic=..., exactly_once=True``,
raylog.pool.output) on a real ZooKeeper, a real Ray and the cluster's real
transaction coordinator:

* N input messages become N outputs, each once, read ``read_committed``;
  a handler that fails (an error, then a bad output) on a batch leaves
  nothing of it visible and its input position unmoved, and the batch is
  transformed once in the end;
* a member killed mid-way (``ray.kill``) is restarted; the output topic
  read ``read_committed`` holds every output exactly once (read
  ``read_uncommitted`` it may hold more: aborted transactions);
* fencing: a producer of a partition's transactional id started elsewhere
  fences the member (its batch's transaction is refused and leaves
  nothing visible); the member starts over, fences that producer in turn
  (the partition is the member's by the group) and the outputs are exactly
  once;
* the at-least-once form (``output_topic`` alone) produces every output;
* options are refused by name before anything starts, and nothing of the
  input is consumed or committed then;
* what a handler may return (``outputs_of``), without Ray;
* the README's example runs as written.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import uuid

import pytest

import pool_helpers
import raylog
from pool_helpers import produce
from raylog.consumer.record import Message
from raylog.pool.output import outputs_of, transactional_id
from raylog.pool.spec import make_spec
from raylog.testing.clusters import wait_until
from tests.doc_blocks import block

pytestmark = pytest.mark.timeout(300)

#: the pools here take no CPU of the shared test Ray, react fast, and move a dead member's partitions soon
FAST = dict(resources={"num_cpus": 0}, sample_interval_s=0.5, commit_interval_s=0.5, session_timeout_ms=3000,
            poll_timeout_ms=200, retry_delay_s=0.05, retry_max_delay_s=0.2, autoscale=False)
WAIT_S = 120.0


@pytest.fixture(autouse=True)
def _handlers_by_value(ray_local):
    from ray import cloudpickle

    pool_helpers.send_by_value()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the members cannot import this module


@pytest.fixture(scope="module", autouse=True)
def coordinator_stopped_after(raylog_client):
    """The module's cluster's coordinator (started by the members' factories) is stopped at the end."""
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    yield
    stop_transaction_coordinator(raylog_client.settings.cluster)


class Transform:
    """``m-<i>`` -> ``out:m-<i>`` under the input's key. ``sleep_s``: a cost
    per batch. ``fail_partition``: its first batch fails twice (an error,
    then a bad output), per member. ``gate``: each batch on ``gate_partition``
    waits (at most 120 s) until the file ``gate`` exists, its start marked by
    the file ``<gate>.began``."""

    def __init__(self, sleep_s: float = 0.0, fail_partition: int | None = None, gate: str | None = None,
                 gate_partition: int = 0):
        self.sleep_s, self.fail_partition = sleep_s, fail_partition
        self.gate, self.gate_partition = gate, gate_partition
        self.failed = 0

    def __call__(self, batch):
        partition = batch[0].partition
        if partition == self.fail_partition and self.failed < 2:
            self.failed += 1
            if self.failed == 1:
                raise ValueError("the first try fails")
            return ["a str is not an output"]
        if self.gate is not None and partition == self.gate_partition:
            open(f"{self.gate}.began", "a").close()
            deadline = time.monotonic() + 120.0
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return [(m.key, b"out:" + m.value) for m in batch]


def _group() -> str:
    return f"eos-{uuid.uuid4().hex[:8]}"


def _read(client, topic: str, isolation: str, timeout_s: float = 60.0) -> list[bytes]:
    """Every value of ``topic`` up to its end now, read with ``isolation``."""
    ends = client.end_offsets(topic)
    consumer = client.consumer(topic, auto_offset_reset="earliest", isolation_level=isolation)
    values = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            values += [m.value for m in consumer.poll(timeout_ms=200)]
            if all((consumer.position(topic, p) or 0) >= end for p, end in ends.items()):
                break
        else:
            raise AssertionError(f"{topic} read {isolation} did not reach {ends}")
    finally:
        consumer.close()
    return values


def _done(pool, client, topic) -> bool:
    """The group committed the end of every input partition."""
    ends = client.end_offsets(topic)
    rows = {r["partition"]: r for r in pool.status()["partitions"]}
    return all(rows.get(p, {}).get("committed") == end for p, end in ends.items())


def _expected(produced: dict) -> list[bytes]:
    return sorted(b"out:" + v.encode() for values in produced.values() for v in values)


def _once_each(values: list[bytes]) -> dict:
    return {v: n for v, n in collections.Counter(values).items() if n != 1}


def test_n_inputs_become_n_outputs_once_each_and_a_failed_batch_leaves_nothing_visible(raylog_client, make_topic):
    source, sink, group = make_topic(2, flush_ms=20), make_topic(2, flush_ms=20), _group()
    produced = produce(raylog_client, source, 300, 2)
    pool = raylog_client.consumer_pool(source, group, Transform(fail_partition=1), output_topic=sink,
                                       exactly_once=True, max_members=1, batch_max=40, max_handler_failures=5,
                                       **FAST)
    try:
        assert wait_until(lambda: _done(pool, raylog_client, source), WAIT_S, 0.5), pool.status()
        rows = {r["partition"]: r for r in pool.status()["partitions"]}
        assert rows[1]["errors"] == 2 and not rows[1]["stopped"]
        assert "ArgumentTypeError" in rows[1]["last_error"]["error"]  # the bad output counted as a failure
        assert rows[0]["errors"] == 0
    finally:
        pool.stop(drain=True)
    committed = _read(raylog_client, sink, "read_committed")
    assert sorted(committed) == _expected(produced), _once_each(committed)
    # nothing of the failed tries was written at all (they failed before their transaction began)
    assert sorted(_read(raylog_client, sink, "read_uncommitted")) == _expected(produced)


def test_a_member_killed_mid_way_is_restarted_and_every_output_is_committed_once(raylog_client, make_topic):
    import ray

    source, sink, group = make_topic(2, flush_ms=20), make_topic(2, flush_ms=20), _group()
    produced = produce(raylog_client, source, 300, 2)
    pool = raylog_client.consumer_pool(source, group, Transform(), output_topic=sink,
                                       exactly_once=True, min_members=2, max_members=2, batch_max=10, **FAST)
    try:
        assert wait_until(lambda: sum(raylog_client.end_offsets(sink).values()) > 0, WAIT_S, 0.1)
        # mid-way, inside a transaction: its outputs sent, not committed (as likely as the coordinator shows)
        coordinator = raylog_client.transaction_coordinator()
        owner = {r["partition"]: r["member"] for r in pool.status()["partitions"]}
        members, victim = pool.members(), None

        def ongoing() -> bool:
            nonlocal victim
            for p in (0, 1):
                record = ray.get(coordinator.describe.remote(transactional_id(group, source, p)), timeout=30)
                if record is not None and record["state"] == "Ongoing" and record["partitions"] and owner.get(p) is not None:
                    victim = owner[p]
                    return True
            return False

        wait_until(ongoing, 30, 0.0)
        ray.kill(members[victim if victim is not None else 0], no_restart=False)
        assert wait_until(lambda: _done(pool, raylog_client, source), WAIT_S, 0.5), pool.status()
    finally:
        pool.stop(drain=True)
    committed = _read(raylog_client, sink, "read_committed")
    assert sorted(committed) == _expected(produced), _once_each(committed)
    uncommitted = _read(raylog_client, sink, "read_uncommitted")
    assert set(uncommitted) == set(committed) and len(uncommitted) >= len(committed)
    print(f"read_uncommitted holds {len(uncommitted) - len(committed)} outputs of aborted transactions")


def test_a_fenced_member_leaves_nothing_visible_and_fences_the_newer_producer_in_turn(raylog_client, make_topic,
                                                                                    tmp_path):
    source, sink, group = make_topic(1, flush_ms=20), make_topic(1, flush_ms=20), _group()
    gate = str(tmp_path / "gate")
    produced = produce(raylog_client, source, 50, 1)
    pool = raylog_client.consumer_pool(source, group, Transform(gate=gate), output_topic=sink, exactly_once=True,
                                       max_members=1, **FAST)
    zombie_maker = None
    try:
        assert wait_until(lambda: os.path.exists(gate + ".began"), WAIT_S, 0.1)
        # A producer of the partition's transactional id starts elsewhere: the member is the zombie now.
        zombie_maker = raylog_client.producer(transactional_id=transactional_id(group, source, 0))
        open(gate, "w").close()
        assert wait_until(lambda: _done(pool, raylog_client, source), WAIT_S, 0.5), pool.status()
        errors = [m["last_error"] for m in pool.status()["members"]]
        assert any("fenced" in e for e in errors), errors  # the member was fenced and started over
        # ... and it fenced the newer producer in turn when it took the partition again
        with pytest.raises(raylog.ProducerFencedError):
            zombie_maker.begin_transaction()
            zombie_maker.send(sink, b"from the fenced producer")
            zombie_maker.commit_transaction()
    finally:
        pool.stop(drain=True)
        if zombie_maker is not None:
            try:
                zombie_maker.close()
            except raylog.RaylogError:
                pass
    committed = _read(raylog_client, sink, "read_committed")
    assert sorted(committed) == _expected(produced), _once_each(committed)


def test_output_topic_alone_produces_every_output_at_least_once(raylog_client, make_topic):
    source, sink, group = make_topic(2, flush_ms=20), make_topic(1, flush_ms=20), _group()
    produced = produce(raylog_client, source, 200, 2)
    pool = raylog_client.consumer_pool(source, group, Transform(), output_topic=sink, max_members=1, **FAST)
    try:
        assert wait_until(lambda: _done(pool, raylog_client, source), WAIT_S, 0.5), pool.status()
    finally:
        pool.stop(drain=True)
    assert set(_read(raylog_client, sink, "read_uncommitted")) == set(_expected(produced))


def _ok(batch):
    return None


def _partitions(topic):
    if topic not in ("in", "out", "dlq"):
        raise raylog.UnknownTopicError(f"topic {topic!r} does not exist")
    return 2


@pytest.mark.parametrize("options,fragment", [
    ({"exactly_once": True}, "exactly_once=True needs output_topic='name'"),
    ({"exactly_once": "yes", "output_topic": "out"}, "exactly_once must be True or False"),
    ({"output_topic": ""}, "output_topic must be a topic name"),
    ({"output_topic": "in"}, "output_topic 'in' is one of the pool's topics"),
    ({"output_topic": "out", "dead_letter_topic": "out"}, "output_topic and dead_letter_topic are both 'out'"),
    ({"transaction_timeout_ms": 5000}, "transaction_timeout_ms is the timeout of exactly_once's transactions"),
    ({"output_topic": "out", "transaction_timeout_ms": 5000}, "give it with exactly_once=True"),
    ({"output_topic": "out", "exactly_once": True, "transaction_timeout_ms": 10}, "at least 1000"),
    ({"output_topic": "out", "exactly_once": True, "transaction_timeout_ms": 10**9}, "at most 900000"),
])
def test_bad_output_options_are_refused_by_name(options, fragment):
    with pytest.raises(raylog.ConfigError) as info:
        make_spec("in", "g", _ok, _partitions, options)
    assert fragment in str(info.value)


def test_an_output_topic_that_does_not_exist_is_refused_before_anything_starts(raylog_client, make_topic):
    with pytest.raises(raylog.UnknownTopicError, match="'nowhere' does not exist"):
        make_spec("in", "g", _ok, _partitions, {"output_topic": "nowhere", "exactly_once": True})
    source, group = make_topic(1, flush_ms=20), _group()
    produced = produce(raylog_client, source, 20, 1)
    with pytest.raises(raylog.UnknownTopicError):
        raylog_client.consumer_pool(source, group, _ok, output_topic="no-such-topic", exactly_once=True, **FAST)
    with pytest.raises(raylog.ConfigError, match="needs output_topic"):
        raylog_client.consumer_pool(source, group, _ok, exactly_once=True, **FAST)
    # nothing started, nothing of the input consumed or committed
    assert raylog_client.list_groups().count(group) == 0
    assert [m.value.decode() for m in raylog_client.consumer(source, auto_offset_reset="earliest").poll(
        timeout_ms=2000)] == produced[0]
    spec = make_spec("in", "g", _ok, _partitions, {"output_topic": "out", "exactly_once": True,
                                                    "dead_letter_topic": "dlq"})
    assert spec.exactly_once and spec.output_topic == "out" and spec.transaction_timeout_ms == 60_000


def test_what_a_handler_may_return():
    message = Message("in", 3, 100, 1234, b"k", b"v")
    assert outputs_of(None) == [] and outputs_of([]) == []
    assert outputs_of([b"a", (b"k", b"b"), (None, b"c"), (b"gone", None), message]) == [
        (None, b"a", None, None), (b"k", b"b", None, None), (None, b"c", None, None), (b"gone", None, None, None),
        (b"k", b"v", None, 1234)]
    for bad, fragment in [("abc", "returns None or a list of outputs"), (b"abc", "returns None or a list"),
                          ({b"a": b"b"}, "got dict"), (["s"], "output 0 of the handler is 's'"),
                          ([b"a", (b"k", "v")], "output 1"), ([(b"k", b"v", b"x")], "output 0"), ([None], "output 0")]:
        with pytest.raises(raylog.ArgumentTypeError, match=fragment):
            outputs_of(bad)


def test_the_readme_exactly_once_example_runs_as_written(raylog_client, capsys):
    """The README's "Exactly once" block on the module's client: 100 words
    become 100 shouted outputs, each once, read read_committed."""
    namespace = {"client": raylog_client, "__name__": "readme_exactly_once"}  # its handler goes by value
    exec(compile(block("README.md", "Exactly once: consume, transform, produce"), "README.md", "exec"), namespace)
    assert capsys.readouterr().out.splitlines()[-1].startswith("100 outputs, 100 distinct; e.g. b'WORD ")
