"""Bad arguments to ``client.consumer_pool`` and ``scale`` get a typed
error naming what is wrong before anything starts (no controller, no
member, no commit), and a refused scale leaves a running pool as it was."""

from __future__ import annotations

import threading
import uuid

import pytest

import pool_helpers
import raylog
from pool_helpers import Recorder, handled, produce
from raylog.pool import PoolHandle
from raylog.pool.spec import make_spec
from raylog.testing.clusters import wait_until


def _ok(batch):
    pass


class NeedsArgument:
    def __init__(self, path):
        self.path = path

    def __call__(self, batch):
        pass


class NoCall:
    pass


def _partitions(topic):
    if topic != "t":
        raise raylog.UnknownTopicError(f"topic {topic!r} does not exist")
    return 4


@pytest.mark.parametrize("topics,group,handler,options,fragment", [
    ("t", "g", _ok, {"max_member": 2}, "unknown option(s) 'max_member'"),
    ("t", "g", _ok, {"dead_letter_topic": "t"}, "dead_letter_topic 't' is one of the pool's topics"),
    ("t", "g", _ok, {"dead_letter_topic": ""}, "dead_letter_topic must be a topic name"),
    ("t", "g", _ok, {"enable_auto_commit": True}, "does not support 'enable_auto_commit'"),
    ("t", "g", _ok, {"min_members": 0}, "min_members must be an integer of at least 1"),
    ("t", "g", _ok, {"min_members": 3, "max_members": 2}, "max_members (2) must be at least min_members (3)"),
    ("t", "g", _ok, {"min_members": 5}, "max_members (4) must be at least min_members (5)"),
    ("t", "g", _ok, {"initial_members": 9}, "initial_members (9) must lie within"),
    ("t", "g", _ok, {"target_lag_s": 0}, "target_lag_s must be a positive number of seconds"),
    ("t", "g", _ok, {"target_lag_s": float("nan")}, "target_lag_s must be a positive number"),
    ("t", "g", _ok, {"batch_max": 0}, "batch_max must be an integer of at least 1"),
    ("t", "g", _ok, {"max_handler_failures": 1.5}, "max_handler_failures must be an integer"),
    ("t", "g", _ok, {"low_lag_s": 9.0}, "low_lag_s (9.0) must be below target_lag_s (5.0)"),
    ("t", "g", _ok, {"cooldown_s": -1}, "cooldown_s must be a non-negative number"),
    ("t", "g", _ok, {"autoscale": "yes"}, "autoscale must be True or False"),
    ("t", "g", _ok, {"auto_offset_reset": "error"}, "auto_offset_reset must be 'earliest' or 'latest'"),
    ("t", "g", _ok, {"resources": {"num_cpu": 1}}, "resources got unknown key(s) 'num_cpu'"),
    ("t", "g", _ok, {"resources": {"num_gpus": -1}}, "resources['num_gpus'] must be a non-negative number"),
    ("t", "g", _ok, {"resources": 2}, "resources must be a dict"),
    ("t", "g", "not callable", {}, "handler must be a function of one batch or a class with __call__"),
    ("t", "g", NeedsArgument, {}, "must be made with no arguments"),
    ("t", "g", NoCall, {}, "has no __call__"),
    ("t", "g", lambda b, lock=threading.Lock(): None, {}, "handler cannot be sent to the members"),
    ("t", "", _ok, {}, "group must be a non-empty name"),
    ("t", "a/b", _ok, {}, "group must be a non-empty name"),
    ([], "g", _ok, {}, "topics must be a topic name or a non-empty list"),
    (["t", "t"], "g", _ok, {}, "topics lists a topic twice"),
])
def test_bad_arguments_are_refused_by_name(topics, group, handler, options, fragment):
    with pytest.raises(raylog.ConfigError) as info:
        make_spec(topics, group, handler, _partitions, options)
    assert fragment in str(info.value)


def test_a_dead_letter_topic_that_does_not_exist_is_refused_before_anything_starts():
    with pytest.raises(raylog.UnknownTopicError, match="'dlq' does not exist"):
        make_spec("t", "g", _ok, _partitions, {"dead_letter_topic": "dlq"})


def test_max_members_defaults_to_the_partition_count():
    assert make_spec(["t"], "g", _ok, _partitions, {}).max_members == 4
    assert make_spec("t", "g", _ok, _partitions, {"max_members": None}).max_members == 4


def test_refused_pools_start_nothing_and_a_refused_scale_changes_nothing(raylog_client, make_topic, tmp_path):
    pool_helpers.send_by_value()
    topic, group, path = make_topic(2, flush_ms=20), f"pool-{uuid.uuid4().hex[:8]}", str(tmp_path / "handled")
    with pytest.raises(raylog.UnknownTopicError):
        raylog_client.consumer_pool([topic, "no-such-topic"], group, _ok)
    with pytest.raises(raylog.ConfigError, match="unknown option"):
        raylog_client.consumer_pool(topic, group, _ok, resources={"num_cpus": 0}, batchmax=5)
    with pytest.raises(raylog.PoolNotFoundError):
        PoolHandle(raylog_client.settings.cluster, group).status()
    assert raylog_client.list_groups().count(group) == 0  # no member joined, nothing committed

    produced = produce(raylog_client, topic, 100, 2)
    pool = raylog_client.consumer_pool(topic, group, Recorder(path), max_members=2, autoscale=False,
                                       resources={"num_cpus": 0}, sample_interval_s=0.5, commit_interval_s=0.5)
    try:
        with pytest.raises(raylog.PoolExistsError):
            raylog_client.consumer_pool(topic, group, _ok, resources={"num_cpus": 0})
        for bad in (0, 3, "2", True):
            with pytest.raises(raylog.ConfigError, match="scales within min_members=1 and max_members=2"):
                pool.scale(bad)
        assert wait_until(lambda: sorted(sum(handled(path).values(), [])) == sorted(sum(produced.values(), [])),
                          120, 0.5)
        assert pool.status()["member_count"] == 1
    finally:
        pool.stop(drain=True)
