"""The cluster registry against a real ZooKeeper (no mocks)."""

from __future__ import annotations

import random
import threading
import time

import pytest
from kazoo.protocol.states import KazooState

from raylog.config import TopicConfig
from raylog.errors import (
    ClosedError,
    ConfigError,
    NotOwnerError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
    ZooKeeperUnavailableError,
)
from raylog.testing.clusters import wait_until as _wait_until
from raylog.testing.faults import drop_connection, expire_session
from raylog.zk.registry import Registry
from raylog.zk.session import connect_kazoo


def wait_until(predicate, timeout_s: float = 30.0) -> bool:
    return _wait_until(predicate, timeout_s, interval_s=0.05)


@pytest.fixture
def topic(registry):
    registry.create_topic("clicks", TopicConfig(partitions=3))
    return "clicks"


# -------------------------------------------------------------- failures first


def test_creating_an_existing_topic_raises_topic_exists(registry):
    registry.create_topic("clicks", TopicConfig(partitions=2))
    with pytest.raises(TopicExistsError, match="already exists"):
        registry.create_topic("clicks", TopicConfig(partitions=5))
    assert registry.topic_config("clicks").partitions == 2  # untouched


@pytest.mark.parametrize(
    "call",
    [
        lambda r: r.topic_config("nope"),
        lambda r: r.delete_topic("nope"),
        lambda r: r.placements("nope"),
        lambda r: r.endpoints("nope"),
        lambda r: r.set_placement("nope", 0, "node-a", "/data/nope-0"),
        lambda r: r.register_endpoint("nope", 0, "127.0.0.1", 9000, "actor", 1),
    ],
    ids=["topic_config", "delete_topic", "placements", "endpoints", "set_placement", "register_endpoint"],
)
def test_unknown_topic_raises_unknown_topic(registry, call):
    with pytest.raises(UnknownTopicError, match="does not exist") as info:
        call(registry)
    assert info.value.topic == "nope"


def test_reads_of_a_missing_topic_are_empty_not_errors(registry):
    assert registry.list_topics() == []
    assert not registry.topic_exists("nope")
    assert registry.placement("nope", 0) is None
    assert registry.endpoint("nope", 0) is None


@pytest.mark.parametrize("name", ["", "a/b", "a b", ".", "..", "x" * 201, "clicks\u00e9", "a:b"])
def test_invalid_topic_names_are_refused(registry, name):
    with pytest.raises(ConfigError, match="invalid topic name"):
        registry.create_topic(name, TopicConfig())
    assert registry.list_topics() == []


def test_longest_valid_topic_name_is_accepted(registry):
    name = "A-z_0." + "x" * 194
    registry.create_topic(name, TopicConfig())
    assert registry.list_topics() == [name]


@pytest.mark.parametrize("partition", [-1, 3, 100])
def test_partition_out_of_range_raises_unknown_partition(registry, topic, partition):
    with pytest.raises(UnknownPartitionError, match=r"partitions 0\.\.2"):
        registry.set_placement(topic, partition, "node-a", "/d")
    with pytest.raises(UnknownPartitionError):
        registry.register_endpoint(topic, partition, "127.0.0.1", 9000, "actor", 1)


def test_an_older_epoch_cannot_replace_a_newer_endpoint(registry, topic):
    registry.register_endpoint(topic, 0, "127.0.0.1", 9002, "actor-v2", 2)
    with pytest.raises(NotOwnerError, match="newer epoch") as info:
        registry.register_endpoint(topic, 0, "127.0.0.1", 9001, "actor-v1", 1)
    assert info.value.current_epoch == 2
    assert registry.endpoint(topic, 0)["epoch"] == 2


def test_bad_endpoint_arguments_are_refused(registry, topic):
    with pytest.raises(ConfigError, match="epoch"):
        registry.register_endpoint(topic, 0, "127.0.0.1", 9000, "actor", -1)
    with pytest.raises(ConfigError, match="port"):
        registry.register_endpoint(topic, 0, "127.0.0.1", 0, "actor", 1)


def test_a_stopped_client_raises_closed_error(make_zk, cluster_name):
    zk = make_zk()
    registry = Registry(zk, cluster_name)
    zk.stop()
    with pytest.raises(ClosedError, match="was stopped"):
        registry.list_topics()


def test_zookeeper_down_raises_unavailable_and_recovers_when_back(private_zookeeper, cluster_name):
    zk = connect_kazoo(private_zookeeper.connect_string, timeout=30.0)
    try:
        registry = Registry(zk, cluster_name, connect_wait_s=0.5, op_timeout_s=5.0)
        registry.create_topic("clicks", TopicConfig(partitions=2))
        registry.set_placement("clicks", 1, "node-a", "/data/clicks-1")

        private_zookeeper.kill_process()
        assert wait_until(lambda: zk.state == KazooState.SUSPENDED)
        calls = [
            lambda: registry.list_topics(),
            lambda: registry.topic_config("clicks"),
            lambda: registry.create_topic("views", TopicConfig()),
            lambda: registry.endpoint("clicks", 0),
            lambda: registry.watch_endpoint("clicks", 0, lambda _: None),
        ]
        for call in calls:
            with pytest.raises(ZooKeeperUnavailableError) as info:
                call()
            message = str(info.value)
            assert "not connected to ZooKeeper" in message
            assert private_zookeeper.connect_string in message
            assert "check that ZooKeeper runs" in message
            assert info.value.retriable

        private_zookeeper.start()
        assert wait_until(lambda: zk.connected)
        assert registry.list_topics() == ["clicks"]  # the refused create did not happen later
        assert registry.placement("clicks", 1) == {"node": "node-a", "log_dir": "/data/clicks-1"}
        registry.create_topic("views", TopicConfig())
        assert registry.list_topics() == ["clicks", "views"]
    finally:
        zk.stop()
        zk.close()


# ------------------------------------------------------------------ round trips


def test_topic_round_trip(registry):
    config = TopicConfig(partitions=4, retention_ms=60_000, segment_bytes=1 << 20, flush_ms=5)
    registry.create_topic("views", config)
    registry.create_topic("clicks", TopicConfig())

    assert registry.topic_exists("views")
    assert registry.topic_config("views") == config
    assert registry.list_topics() == ["clicks", "views"]

    registry.delete_topic("views")
    assert not registry.topic_exists("views")
    assert registry.list_topics() == ["clicks"]
    with pytest.raises(UnknownTopicError):
        registry.delete_topic("views")


def test_create_topic_makes_one_node_per_partition(registry, zk):
    registry.create_topic("clicks", TopicConfig(partitions=5))
    children = zk.get_children(registry.paths.partitions("clicks"))
    assert sorted(children, key=int) == ["0", "1", "2", "3", "4"]
    assert registry.placements("clicks") == {}
    assert registry.endpoints("clicks") == {}


def test_clusters_do_not_see_each_other(zk, cluster_name):
    first, second = Registry(zk, cluster_name), Registry(zk, cluster_name + "-other")
    first.create_topic("clicks", TopicConfig())
    assert second.list_topics() == []
    second.create_topic("clicks", TopicConfig(partitions=3))  # no clash
    assert first.topic_config("clicks").partitions == 1


def test_placement_round_trip(registry, topic):
    assert registry.placement(topic, 0) is None
    registry.set_placement(topic, 0, "ray:node-a", "/data/a/clicks-0")
    registry.set_placement(topic, 2, "ray:node-b", "/data/b/clicks-2")
    assert registry.placement(topic, 0) == {"node": "ray:node-a", "log_dir": "/data/a/clicks-0"}

    registry.set_placement(topic, 0, "ray:node-c", "/data/c/clicks-0")  # moved
    assert registry.placements(topic) == {
        0: {"node": "ray:node-c", "log_dir": "/data/c/clicks-0"},
        2: {"node": "ray:node-b", "log_dir": "/data/b/clicks-2"},
    }


def test_endpoint_round_trip_and_unregister_by_epoch(registry, topic):
    registry.register_endpoint(topic, 1, "127.0.0.1", 9001, "raylog/x/clicks/1", 7)
    expected = {"host": "127.0.0.1", "port": 9001, "actor": "raylog/x/clicks/1", "epoch": 7}
    assert registry.endpoint(topic, 1) == expected
    assert registry.endpoints(topic) == {1: expected}

    assert registry.unregister_endpoint(topic, 1, 6) is False  # not its epoch
    assert registry.endpoint(topic, 1) == expected
    assert registry.unregister_endpoint(topic, 1, 7) is True
    assert registry.endpoint(topic, 1) is None
    assert registry.unregister_endpoint(topic, 1, 7) is False


def test_endpoint_is_ephemeral_and_disappears_when_its_client_closes(registry, topic, make_zk, cluster_name):
    actor_zk = make_zk()
    Registry(actor_zk, cluster_name).register_endpoint(topic, 0, "127.0.0.1", 9000, "actor", 1)
    assert registry.endpoint(topic, 0)["port"] == 9000
    node = registry.zk.exists(registry.paths.endpoint(topic, 0))
    assert node.ephemeralOwner == actor_zk.client_id[0]

    actor_zk.stop()
    assert registry.endpoint(topic, 0) is None
    registry.set_placement(topic, 0, "node-a", "/d")  # the placement is persistent
    assert registry.placement(topic, 0) == {"node": "node-a", "log_dir": "/d"}


def test_a_newer_epoch_replaces_the_endpoint_a_stale_actor_left(registry, topic, make_zk, cluster_name):
    stale_zk, fresh_zk = make_zk(), make_zk()
    stale = Registry(stale_zk, cluster_name)
    fresh = Registry(fresh_zk, cluster_name)
    stale.register_endpoint(topic, 2, "127.0.0.1", 9001, "actor", 1)

    # the old actor's session still lives, yet the restarted actor takes over
    fresh.register_endpoint(topic, 2, "127.0.0.1", 9002, "actor", 2)
    assert registry.endpoint(topic, 2) == {"host": "127.0.0.1", "port": 9002, "actor": "actor", "epoch": 2}

    # the stale actor's clean-up leaves the new endpoint alone ...
    assert stale.unregister_endpoint(topic, 2, 1) is False
    # ... and so does the end of its session
    stale_zk.stop()
    assert registry.endpoint(topic, 2)["epoch"] == 2
    node = registry.zk.exists(registry.paths.endpoint(topic, 2))
    assert node.ephemeralOwner == fresh_zk.client_id[0]


def test_the_same_epoch_overwrites_and_takes_the_node_over(registry, topic, make_zk, cluster_name):
    first_zk, second_zk = make_zk(), make_zk()
    first = Registry(first_zk, cluster_name)
    first.register_endpoint(topic, 0, "127.0.0.1", 9001, "actor", 3)
    first.register_endpoint(topic, 0, "127.0.0.1", 9002, "actor", 3)  # its own node: overwritten
    assert registry.endpoint(topic, 0)["port"] == 9002

    Registry(second_zk, cluster_name).register_endpoint(topic, 0, "127.0.0.1", 9003, "actor", 3)
    first_zk.stop()  # the node now lives with the second session
    assert registry.endpoint(topic, 0) == {"host": "127.0.0.1", "port": 9003, "actor": "actor", "epoch": 3}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_concurrent_registrations_leave_the_newest_epoch(registry, topic, make_zk, cluster_name, seed):
    """Racing incarnations (some replacing an older endpoint, which restarts
    ZooKeeper's node version at 0) always leave the newest epoch registered."""
    registry.register_endpoint(topic, 1, "127.0.0.1", 9000, "actor", 0)
    epochs = list(range(1, 9))
    random.Random(seed).shuffle(epochs)
    registries = {epoch: Registry(make_zk(), cluster_name) for epoch in epochs}
    errors: list[BaseException] = []
    start = threading.Barrier(len(epochs))

    def register(epoch):
        start.wait()
        try:
            registries[epoch].register_endpoint(topic, 1, "127.0.0.1", 9000 + epoch, "actor", epoch)
        except NotOwnerError:
            pass  # a newer epoch got there first: expected
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=register, args=(epoch,)) for epoch in epochs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert registry.endpoint(topic, 1) == {"host": "127.0.0.1", "port": 9008, "actor": "actor", "epoch": 8}


def test_delete_topic_removes_placements_and_live_endpoints(registry, topic, make_zk, cluster_name):
    registry.set_placement(topic, 0, "node-a", "/d0")
    Registry(make_zk(), cluster_name).register_endpoint(topic, 0, "127.0.0.1", 9000, "actor", 1)
    registry.register_endpoint(topic, 1, "127.0.0.1", 9001, "actor", 1)

    registry.delete_topic(topic)
    assert registry.zk.exists(registry.paths.topic(topic)) is None
    registry.create_topic(topic, TopicConfig(partitions=1))  # the name is free again
    assert registry.placements(topic) == {} and registry.endpoints(topic) == {}


def test_watch_endpoint_reports_appear_move_and_vanish(registry, topic, make_zk, cluster_name):
    seen: list = []
    changed = threading.Condition()

    def on_change(endpoint):
        with changed:
            seen.append(endpoint)
            changed.notify_all()

    def wait_for(count):
        with changed:
            assert changed.wait_for(lambda: len(seen) >= count, timeout=30), seen

    watch = registry.watch_endpoint(topic, 0, on_change)
    wait_for(1)
    assert seen == [None]  # called at once with the current state

    old = Registry(make_zk(), cluster_name)
    old.register_endpoint(topic, 0, "127.0.0.1", 9001, "actor", 1)
    wait_for(2)
    assert seen[-1]["port"] == 9001

    Registry(make_zk(), cluster_name).register_endpoint(topic, 0, "127.0.0.1", 9002, "actor", 2)
    with changed:
        assert changed.wait_for(lambda: seen[-1] is not None and seen[-1]["port"] == 9002, timeout=30), seen

    registry.unregister_endpoint(topic, 0, 2)
    with changed:
        assert changed.wait_for(lambda: seen[-1] is None, timeout=30), seen

    watch.cancel()
    count = len(seen)
    registry.register_endpoint(topic, 0, "127.0.0.1", 9003, "actor", 3)
    registry.register_endpoint(topic, 0, "127.0.0.1", 9004, "actor", 3)
    assert wait_until(lambda: registry.endpoint(topic, 0)["port"] == 9004)
    time.sleep(0.5)  # give a (wrong) callback the chance to arrive
    assert len(seen) == count


# ------------------------------------------------------------------ fault kit


def test_expire_session_really_expires_it(registry, topic, make_zk, cluster_name):
    actor_zk = make_zk()
    actor = Registry(actor_zk, cluster_name)
    actor.register_endpoint(topic, 0, "127.0.0.1", 9000, "actor", 1)
    old_session = actor_zk.client_id[0]
    states: list = []
    actor_zk.add_listener(states.append)

    expire_session(actor_zk)

    assert KazooState.LOST in states
    assert registry.endpoint(topic, 0) is None  # the ephemeral node died with the session
    assert actor_zk.connected and actor_zk.client_id[0] != old_session
    actor.register_endpoint(topic, 0, "127.0.0.1", 9000, "actor", 1)  # and it works again
    assert registry.endpoint(topic, 0)["epoch"] == 1


def test_drop_connection_keeps_the_session_and_its_endpoints(registry, topic, make_zk, cluster_name):
    actor_zk = make_zk()
    actor = Registry(actor_zk, cluster_name)
    actor.register_endpoint(topic, 0, "127.0.0.1", 9000, "actor", 1)
    session = actor_zk.client_id[0]
    states: list = []
    actor_zk.add_listener(states.append)

    drop_connection(actor_zk)

    assert KazooState.SUSPENDED in states and KazooState.LOST not in states
    assert actor_zk.client_id[0] == session
    assert registry.endpoint(topic, 0)["port"] == 9000
    assert actor.list_topics() == [topic]


def test_a_failing_watch_callback_is_logged_and_the_watch_goes_on(registry, topic, caplog):
    seen: list = []

    def flaky(endpoint):
        seen.append(endpoint)
        if len(seen) == 1:
            raise RuntimeError("boom")

    registry.watch_endpoint(topic, 2, flaky)
    assert "boom" in caplog.text
    registry.register_endpoint(topic, 2, "127.0.0.1", 9000, "actor", 1)
    assert wait_until(lambda: len(seen) >= 2 and seen[-1] is not None)


def test_watch_stops_when_the_callback_returns_false(registry, topic):
    seen: list = []
    registry.watch_endpoint(topic, 0, lambda endpoint: seen.append(endpoint) or False)
    registry.register_endpoint(topic, 0, "127.0.0.1", 9000, "actor", 1)
    assert wait_until(lambda: registry.endpoint(topic, 0) is not None)
    time.sleep(0.5)  # give a (wrong) callback the chance to arrive
    assert seen == [None]


# ------------------------------------------------------- the error translation


@pytest.mark.parametrize(
    "raised, expected, words",
    [
        ("SessionExpiredError", "SessionExpiredError", "session expired"),
        ("ConnectionLoss", "ZooKeeperUnavailableError", "did not answer"),
        ("OperationTimeoutError", "ZooKeeperUnavailableError", "did not answer"),
        ("ConnectionClosedError", "ClosedError", "was stopped"),
    ],
)
def test_kazoo_failures_become_actionable_raylog_errors(zk, raised, expected, words):
    import kazoo.exceptions

    import raylog.errors
    from raylog.zk.errors import zookeeper_errors

    with pytest.raises(getattr(raylog.errors, expected), match=words) as info:
        with zookeeper_errors(zk, "do a thing"):
            raise getattr(kazoo.exceptions, raised)()
    assert str(info.value).startswith("cannot do a thing: ")
    assert type(info.value).__name__ == expected


def test_node_errors_pass_through_the_translation(zk):
    from kazoo.exceptions import NoNodeError

    from raylog.zk.errors import zookeeper_errors

    with pytest.raises(NoNodeError):
        with zookeeper_errors(zk, "read"):
            zk.get("/raylog/definitely/not/here")


def test_a_call_while_zookeeper_is_away_waits_for_the_reconnect_notice_and_leaves_no_listener(
        private_zookeeper, cluster_name):
    zk = connect_kazoo(private_zookeeper.connect_string, timeout=30.0)
    try:
        registry = Registry(zk, cluster_name, connect_wait_s=120.0, op_timeout_s=30.0)
        registry.create_topic("back", TopicConfig(partitions=1))
        listeners = len(zk.state_listeners)
        private_zookeeper.kill_process()
        assert wait_until(lambda: zk.state == KazooState.SUSPENDED)
        restart = threading.Timer(1.0, private_zookeeper.start)
        restart.start()
        try:
            assert registry.list_topics() == ["back"]  # waited for the connection, then answered
        finally:
            restart.join()
        assert len(zk.state_listeners) == listeners
    finally:
        zk.stop()
        zk.close()


# -- adding partitions (client.add_partitions) -----------------------------------


def test_add_partitions_writes_the_count_and_the_placements_in_one_transaction(registry):
    registry.create_topic("grows", TopicConfig(partitions=1, retention_ms=5000))
    config, version = registry.topic_config_version("grows")
    places = {1: {"node": "ip:10.0.0.1", "log_dir": "/d/grows-1"}, 2: {"node": "ip:10.0.0.2", "log_dir": "/d/grows-2"}}
    assert registry.add_partitions("grows", config.replace(partitions=3), version, places)
    assert registry.topic_config("grows") == TopicConfig(partitions=3, retention_ms=5000)
    assert registry.placements("grows") == places
    # a writer holding the old version changes nothing: it reads again
    more = {3: {"node": "ip:10.0.0.1", "log_dir": "/d/grows-3"}}
    assert not registry.add_partitions("grows", config.replace(partitions=4), version, more)
    assert registry.topic_config("grows").partitions == 3 and 3 not in registry.placements("grows")
    assert registry.placement("grows", 3) is None


def test_add_partitions_to_a_deleted_topic_is_unknown(registry):
    registry.create_topic("gone", TopicConfig(partitions=1))
    config, version = registry.topic_config_version("gone")
    registry.delete_topic("gone")
    with pytest.raises(UnknownTopicError):
        registry.add_partitions("gone", config.replace(partitions=2), version,
                                {1: {"node": "ip:10.0.0.1", "log_dir": "/d/gone-1"}})
    assert not registry.topic_exists("gone")
    with pytest.raises(UnknownTopicError):
        registry.topic_config_version("gone")
