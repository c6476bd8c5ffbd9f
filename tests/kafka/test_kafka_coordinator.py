"""Kafka-protocol consumer groups (raylog.kafka.coordinator): the group state
machine alone, then real Kafka clients that ``subscribe()`` (confluent-kafka
and kafka-python) against the listeners of a real embedded cluster (real
ZooKeeper and Ray): sharing a topic, taking over a closed or killed
member's partitions from the committed offsets, and groups that mix raylog
and Kafka consumers refused both ways."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from raylog.kafka import coordinator as co
from raylog.kafka.coordinator import Group

#: how long a client may take for anything here (a loaded machine)
WAIT_S = 60.0
SESSION_MS = 3000
#: the session timeout of the real clients: long enough that a loaded machine never drops a live one
CLIENT_SESSION_MS = 6000


# -- the state machine alone ---------------------------------------------------------


def _join(group, member_id="", now=0.0, protocols=(("range", b"m"),), session_ms=SESSION_MS, rebalance_ms=5000,
          protocol_type="consumer", instance=None):
    return group.join(member_id, "client", protocol_type, list(protocols), session_ms, rebalance_ms, now, instance)


def test_first_member_leads_and_the_leader_assignment_goes_to_everyone():
    group = Group("g")
    error, a = _join(group)
    assert error == co.NONE and a.startswith("client-")
    # alone: the join completes at once, generation 1, a leads with its own metadata
    result = group.members[a].join_result
    assert (result.error, result.generation, result.leader, result.protocol) == (co.NONE, 1, a, "range")
    assert result.members == [(a, b"m")] and group.state == co.COMPLETING_REBALANCE
    assert group.heartbeat(a, 1, 0.1) == co.NONE  # between JoinGroup and SyncGroup
    assert group.sync(a, 1, {a: b"all"}, 0.2) == co.NONE
    assert group.members[a].sync_result == (co.NONE, b"all") and group.state == co.STABLE
    assert group.heartbeat(a, 1, 0.3) == co.NONE

    # b joins: a rebalance; a hears of it in its heartbeat; b's answer waits for a
    error, b = _join(group, now=1.0)
    assert error == co.NONE and group.state == co.PREPARING_REBALANCE
    assert group.members[b].join_result is None
    assert group.heartbeat(a, 1, 1.1) == co.REBALANCE_IN_PROGRESS
    assert group.check_commit(a, 1, 1.1) == co.NONE  # a commits what it processed before joining again
    assert _join(group, a, now=1.2) == (co.NONE, a)
    ra, rb = group.members[a].join_result, group.members[b].join_result
    assert (ra.generation, rb.generation, ra.leader, rb.leader) == (2, 2, a, a)
    assert sorted(ra.members) == sorted([(a, b"m"), (b, b"m")]) and rb.members == []
    # the follower's SyncGroup waits for the leader's
    assert group.check_commit(b, 2, 1.3) == co.REBALANCE_IN_PROGRESS
    assert group.sync(b, 2, None, 1.3) == co.NONE and group.members[b].sync_result is None
    assert group.sync(a, 2, {a: b"0,1", b: b"2,3"}, 1.4) == co.NONE
    assert group.members[b].sync_result == (co.NONE, b"2,3")
    assert group.members[a].sync_result == (co.NONE, b"0,1")
    # an old generation and an unknown member are told so
    assert group.heartbeat(a, 1, 1.5) == co.ILLEGAL_GENERATION
    assert group.check_commit(a, 1, 1.5) == co.ILLEGAL_GENERATION
    assert group.heartbeat("nobody", 2, 1.5) == co.UNKNOWN_MEMBER_ID
    assert _join(group, "nobody", now=1.5)[0] == co.UNKNOWN_MEMBER_ID
    assert group.check_commit("", -1, 1.5) == co.UNKNOWN_MEMBER_ID  # assign + commit into a live group

    # b leaves: a rebalance of a alone
    assert group.leave(b, 2.0) == co.NONE and group.state == co.PREPARING_REBALANCE
    assert group.leave(b, 2.0) == co.UNKNOWN_MEMBER_ID
    _join(group, a, now=2.1)
    assert group.members[a].join_result.generation == 3


def test_a_silent_member_is_removed_after_its_session_timeout():
    group = Group("g")
    _, a = _join(group, now=0.0)
    _, b = _join(group, now=0.0)
    _join(group, a, now=0.0)  # both joined: generation 2 (a joined first, then b, then a again)
    gen = group.generation
    group.sync(a, gen, {a: b"x", b: b"y"}, 0.0)
    group.sync(b, gen, None, 0.0)
    assert group.state == co.STABLE
    # a heartbeats, b does not
    for now in (1.0, 2.0, 3.0):
        assert group.heartbeat(a, gen, now) == co.NONE
        assert not group.tick(now)
    assert group.tick(3.1)  # b's 3 s passed
    assert sorted(group.members) == [a] and group.state == co.PREPARING_REBALANCE
    assert group.heartbeat(a, gen, 3.2) == co.REBALANCE_IN_PROGRESS
    assert group.heartbeat(b, gen, 3.2) == co.UNKNOWN_MEMBER_ID
    _join(group, a, now=3.3)
    assert group.members[a].join_result.generation == gen + 1
    assert group.members[a].join_result.members == [(a, b"m")]


def test_the_rebalance_timeout_removes_members_that_do_not_join_again():
    group = Group("g")
    _, a = _join(group, now=0.0, rebalance_ms=2000)
    group.sync(a, 1, {a: b""}, 0.0)
    _, b = _join(group, now=10.0, rebalance_ms=2000)  # a keeps heartbeating but never joins again
    for now in (10.5, 11.0, 11.5):
        group.heartbeat(a, 1, now)
        group.tick(now)
    assert group.members[b].join_result is None
    assert group.tick(12.0)
    assert sorted(group.members) == [b]
    result = group.members[b].join_result
    assert (result.error, result.leader, result.generation) == (co.NONE, b, 2)
    # a waiting follower's SyncGroup is answered REBALANCE_IN_PROGRESS when a rebalance starts
    _, c = _join(group, now=12.1)
    _join(group, b, now=12.2)
    gen = group.generation
    assert group.sync(c, gen, None, 12.3) == co.NONE
    _join(group, "", now=12.4)  # a fourth member arrives before the leader's SyncGroup
    assert group.members[c].sync_result == (co.REBALANCE_IN_PROGRESS, b"")


def test_joins_that_do_not_fit_the_group_are_refused():
    group = Group("g")
    _, a = _join(group, protocols=[("range", b"")])
    assert _join(group, protocols=[("roundrobin", b"")])[0] == co.INCONSISTENT_GROUP_PROTOCOL
    assert _join(group, protocol_type="connect")[0] == co.INCONSISTENT_GROUP_PROTOCOL
    assert _join(group, session_ms=10)[0] == co.INVALID_SESSION_TIMEOUT
    assert sorted(group.members) == [a]
    # a member offering both picks the leader's first common protocol
    _, b = _join(group, protocols=[("roundrobin", b"1"), ("range", b"2")])
    _join(group, a, protocols=[("range", b"")])
    assert group.members[a].join_result.protocol == "range"


def _stable_pair(instances=("ia", "ib")):
    """A STABLE group of two members (static when ``instances`` name them), a leading; a gets 0,1, b 2,3."""
    group = Group("g")
    _, a = _join(group, instance=instances[0])
    group.sync(a, 1, {a: b"all"}, 0.1, instances[0])
    _, b = _join(group, now=1.0, instance=instances[1])
    _join(group, a, now=1.1, instance=instances[0])
    assert group.sync(b, 2, None, 1.2, instances[1]) == co.NONE
    assert group.sync(a, 2, {a: b"0,1", b: b"2,3"}, 1.3, instances[0]) == co.NONE
    assert group.state == co.STABLE and group.generation == 2
    return group, a, b


def test_a_static_member_that_joins_again_takes_its_place_without_a_rebalance_and_fences_its_old_id():
    group, a, b = _stable_pair()
    assert group.static == {"ia": a, "ib": b}
    # a restarts (its client sent no LeaveGroup): a new member id, answered at once, the same generation
    error, a2 = _join(group, now=2.0, instance="ia")
    assert error == co.NONE and a2 != a
    result = group.members[a2].join_result
    assert (result.error, result.generation, result.leader) == (co.NONE, 2, a2)  # a led: a2 leads
    assert sorted(result.members) == sorted([(a2, b"m"), (b, b"m")])
    assert result.instances == {a2: "ia", b: "ib"}
    assert group.state == co.STABLE and group.generation == 2  # no rebalance: b hears of nothing
    assert group.heartbeat(b, 2, 2.1, "ib") == co.NONE
    # a2 syncs and gets a's assignment (the leader's assignments of a stable group change nothing)
    assert group.sync(a2, 2, {a2: b"other"}, 2.2, "ia") == co.NONE
    assert group.members[a2].sync_result == (co.NONE, b"0,1")
    assert group.members[b].assignment == b"2,3"
    # the old member id is fenced wherever it shows up with its instance id
    assert group.heartbeat(a, 2, 2.3, "ia") == co.FENCED_INSTANCE_ID
    assert group.check_commit(a, 2, 2.3, "ia") == co.FENCED_INSTANCE_ID
    assert group.sync(a, 2, None, 2.3, "ia") == co.FENCED_INSTANCE_ID
    assert _join(group, a, now=2.3, instance="ia")[0] == co.FENCED_INSTANCE_ID
    assert group.leave(a, 2.3, "ia") == co.FENCED_INSTANCE_ID
    assert group.heartbeat(a, 2, 2.3) == co.UNKNOWN_MEMBER_ID  # and as a plain member id it is gone
    # an instance id the group does not have
    assert group.heartbeat(b, 2, 2.4, "nobody") == co.UNKNOWN_MEMBER_ID
    assert group.state == co.STABLE and group.generation == 2


def test_a_static_member_is_removed_by_leave_by_instance_id_and_by_its_session_timeout():
    group, a, b = _stable_pair()
    # Kafka's removal of a static member names only its instance id
    assert group.leave("", 3.0, "ib") == co.NONE
    assert b not in group.members and "ib" not in group.static and group.state == co.PREPARING_REBALANCE
    _join(group, a, now=3.1, instance="ia")
    assert group.members[a].join_result.generation == 3
    group.sync(a, 3, {a: b"0,1,2,3"}, 3.2, "ia")
    # silent past its session timeout: removed as a dynamic member is, the instance id freed
    group.tick(3.2 + SESSION_MS / 1000.0 + 0.1)
    assert group.members == {} and group.static == {} and group.state == co.EMPTY
    # the instance joins again as a new member
    error, a3 = _join(group, now=10.0, instance="ia")
    assert error == co.NONE and group.static == {"ia": a3}


def test_a_static_member_that_joins_again_during_a_rebalance_joins_it():
    group, a, b = _stable_pair()
    _, c = _join(group, now=4.0)  # a dynamic member: a rebalance
    assert group.state == co.PREPARING_REBALANCE
    error, a2 = _join(group, now=4.1, instance="ia")  # a restarted meanwhile
    assert error == co.NONE and group.members[a2].join_result is None  # it waits with the others
    _join(group, b, now=4.2, instance="ib")
    results = {m: group.members[m].join_result for m in (a2, b, c)}
    assert {r.generation for r in results.values()} == {3} and results[a2].leader == a2
    assert a not in group.members and group.static == {"ia": a2, "ib": b}


def test_each_group_has_one_coordinator_among_the_listeners(zk, cluster_name):
    """A stable hash of the group id over the registered listeners: every
    listener names the same one; the others answer NOT_COORDINATOR."""
    import zlib

    from kafka.protocol.consumer import HeartbeatRequest, JoinGroupRequest

    from raylog.kafka import brokers
    from raylog.kafka.coordinator import Coordinator
    from raylog.zk.paths import Paths

    paths = Paths(cluster_name)
    entries = [brokers.register(zk, paths, node, "127.0.0.1", port) for node, port in (("n-b", 9002), ("n-a", 9001))]
    a, b = Coordinator(zk, paths, lambda: entries[1]), Coordinator(zk, paths, lambda: entries[0])
    try:
        groups = [f"g{i}" for i in range(40)]
        for group in groups:
            expected = ["n-a", "n-b"][zlib.crc32(group.encode()) % 2]
            assert a.entry_for(group)["node"] == b.entry_for(group)["node"] == expected
        mine = next(g for g in groups if a.entry_for(g)["node"] == "n-a")
        Protocol = JoinGroupRequest.JoinGroupRequestProtocol
        join = JoinGroupRequest[5](group_id=mine, session_timeout_ms=SESSION_MS, rebalance_timeout_ms=5000,
                                   member_id="", group_instance_id=None, protocol_type="consumer",
                                   protocols=[Protocol(name="range", metadata=b"")])
        assert b.join_group(join, 5, "c").error_code == co.NOT_COORDINATOR
        answer = a.join_group(join, 5, "c")
        assert answer.error_code == co.NONE and answer.generation_id == 1
        beat = HeartbeatRequest[3](group_id=mine, generation_id=1, member_id=answer.member_id, group_instance_id=None)
        assert b.heartbeat(beat, 3).error_code == co.NOT_COORDINATOR
        assert a.heartbeat(beat, 3).error_code == co.NONE
    finally:
        a.close()
        b.close()


# -- real clients --------------------------------------------------------------------

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")


def _topic(raylog_client, partitions: int) -> str:
    name = f"kc-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(name, partitions=partitions)
    return name


def _produce(raylog_client, topic: str, values: list[bytes], partitions: int) -> None:
    with raylog_client.producer(batch_size=20) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, partition=i % partitions)
        producer.flush(WAIT_S)


def _confluent(config: dict, group: str, **extra):
    return confluent_kafka.Consumer({
        **config, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": CLIENT_SESSION_MS, "heartbeat.interval.ms": 300, "partition.assignment.strategy": "range",
        "fetch.wait.max.ms": 100, **extra})


def _kafka_python_settings(config: dict) -> dict:
    return dict(
        bootstrap_servers=config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=config["sasl.username"],
        sasl_plain_password=config["sasl.password"])


def _poll_until(consumers, done, got: dict | None = None, what: str = "condition"):
    """Poll each consumer in turn until ``done()``; messages go to ``got[consumer]``."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        for consumer in consumers:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            if got is not None:
                got.setdefault(consumer, []).append(msg)


def _parts(consumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def _next_offsets(got: dict) -> dict[int, int]:
    """{partition: the last offset read + 1} of the messages in ``got``."""
    last: dict[int, int] = {}
    for messages in got.values():
        for m in messages:
            last[m.partition()] = max(last.get(m.partition(), -1), m.offset())
    return {p: o + 1 for p, o in last.items()}


def _committed(raylog_client, group: str, topic: str) -> dict[int, int]:
    from raylog.groups.offsets import OffsetStore

    store = OffsetStore(raylog_client._zk, raylog_client.settings.cluster)
    return {p: o for (t, p), o in store.committed_all(group).items() if t == topic}


def test_two_confluent_consumers_share_a_topic_and_one_takes_over_when_the_other_leaves(
        raylog_client, kafka_config):
    topic = _topic(raylog_client, 4)
    group = f"kg-{uuid.uuid4().hex[:8]}"
    first, second = _confluent(kafka_config, group), _confluent(kafka_config, group)
    try:
        first.subscribe([topic])
        second.subscribe([topic])
        _poll_until([first, second], lambda: len(_parts(first)) == 2 and len(_parts(second)) == 2,
                    what="two partitions each")
        assert _parts(first) | _parts(second) == {0, 1, 2, 3}
        # raylog's admin shows the Kafka group before any commit: its members and who owns what
        assert group in raylog_client.list_groups()
        rows = [r for r in raylog_client.describe_group(group) if r["topic"] == topic]
        assert {r["partition"]: r["owner"] for r in rows} == {
            p: c.memberid() for c in (first, second) for p in _parts(c)}
        assert all(r["members"] == sorted([first.memberid(), second.memberid()]) for r in rows)

        values = [f"a{i}".encode() for i in range(200)]
        _produce(raylog_client, topic, values, 4)
        got: dict = {}
        _poll_until([first, second], lambda: sum(len(v) for v in got.values()) >= len(values), got,
                    what="first batch")
        for consumer in (first, second):
            assert {m.partition() for m in got[consumer]} == _parts(consumer)
            consumer.commit(asynchronous=False)
        # together they read every message once
        assert sorted(m.value() for ms in got.values() for m in ms) == sorted(values)
        committed = _committed(raylog_client, group, topic)
        assert committed == _next_offsets(got)  # Kafka's rule: the last offset read + 1
        # raylog's own admin shows the Kafka group's offsets
        rows = raylog_client.describe_group(group)
        assert {(r["topic"], r["partition"], r["committed"]) for r in rows} >= {
            (topic, p, o) for p, o in committed.items()}

        # the second leaves: the first gets all four and goes on from the committed offsets
        second.close()
        second = None
        _poll_until([first], lambda: _parts(first) == {0, 1, 2, 3}, what="all four partitions")
        more = [f"b{i}".encode() for i in range(100)]
        _produce(raylog_client, topic, more, 4)
        got = {}
        _poll_until([first], lambda: len(got.get(first, [])) >= len(more), got, what="second batch")
        time.sleep(1.0)  # anything read twice would come now
        _poll_until([first], lambda: True, got)
        assert sorted(m.value() for m in got[first]) == sorted(more)
        first.commit(asynchronous=False)
        assert _committed(raylog_client, group, topic) == _next_offsets(got)
    finally:
        for consumer in (first, second):
            if consumer is not None:
                consumer.close()


def test_a_static_confluent_member_restarted_within_its_session_gets_its_partitions_back_without_a_rebalance(
        raylog_client, kafka_config):
    from kafka.admin import KafkaAdminClient

    topic = _topic(raylog_client, 4)
    group = f"ks-{uuid.uuid4().hex[:8]}"
    static = {"session.timeout.ms": 60_000}  # long: a's absence must not end its membership here
    assigned = {"a": 0, "b": 0}

    def counting(name):
        return lambda consumer, partitions: assigned.__setitem__(name, assigned[name] + 1)

    first = _confluent(kafka_config, group, **{"group.instance.id": "ia"}, **static)
    second = _confluent(kafka_config, group, **{"group.instance.id": "ib"}, **static)
    again = None
    try:
        first.subscribe([topic], on_assign=counting("a"))
        second.subscribe([topic], on_assign=counting("b"))
        _poll_until([first, second], lambda: len(_parts(first)) == 2 and len(_parts(second)) == 2,
                    what="two partitions each")
        _poll_until([first, second], lambda: True)
        theirs, ours, b_rounds = _parts(first), _parts(second), assigned["b"]
        admin = KafkaAdminClient(**_kafka_python_settings(kafka_config))
        try:
            described = admin.describe_groups([group])[group]
        finally:
            admin.close()
        assert sorted(m["group_instance_id"] for m in described["members"]) == ["ia", "ib"]
        old_id = first.memberid()

        # a's process ends (a static member sends no LeaveGroup) and comes back with the same instance id
        first.close()
        first = None
        again = _confluent(kafka_config, group, **{"group.instance.id": "ia"}, **static)
        again.subscribe([topic], on_assign=counting("a"))
        _poll_until([again, second], lambda: _parts(again) == theirs, what="a's partitions back")
        time.sleep(2.0)  # a rebalance, had there been one, would reach b now
        _poll_until([again, second], lambda: True)
        assert again.memberid() != old_id
        assert _parts(second) == ours and assigned["b"] == b_rounds  # b was not moved, nor asked to join again

        values = [f"s{i}".encode() for i in range(100)]
        _produce(raylog_client, topic, values, 4)
        got: dict = {}
        _poll_until([again, second], lambda: sum(len(v) for v in got.values()) >= len(values), got, what="messages")
        assert {m.partition() for m in got.get(again, [])} <= theirs
        assert sorted(m.value() for ms in got.values() for m in ms) == sorted(values)
    finally:
        for consumer in (first, second, again):
            if consumer is not None:
                consumer.close()


def test_kafka_python_consumer_joins_consumes_and_commits(raylog_client, kafka_config):
    from kafka import KafkaConsumer

    topic = _topic(raylog_client, 2)
    group = f"kp-{uuid.uuid4().hex[:8]}"
    values = [f"p{i}".encode() for i in range(60)]
    _produce(raylog_client, topic, values, 2)
    consumer = KafkaConsumer(topic, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=CLIENT_SESSION_MS, heartbeat_interval_ms=300,
                             **_kafka_python_settings(kafka_config))
    try:
        got, last = [], {}
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(values) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                got.extend(r.value for r in records)
                last[tp.partition] = records[-1].offset
        assert sorted(got) == sorted(values)
        assert {tp.partition for tp in consumer.assignment()} == {0, 1}
        consumer.commit()
        # kafka-python's position is past the whole batch read: here the log end
        assert _committed(raylog_client, group, topic) == {p: raylog_client.offsets(topic, p)[1] for p in range(2)}
        assert all(raylog_client.offsets(topic, p)[1] > last[p] for p in range(2))
    finally:
        consumer.close()


_CHILD = textwrap.dedent("""
    import sys, time
    from kafka import KafkaConsumer
    settings = eval(sys.argv[1])
    consumer = KafkaConsumer(sys.argv[2], group_id=sys.argv[3], enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=%d, heartbeat_interval_ms=300,
                             **settings)
    while True:
        consumer.poll(timeout_ms=200)
        print(sorted(tp.partition for tp in consumer.assignment()), flush=True)
""" % CLIENT_SESSION_MS)


def test_a_killed_member_is_removed_after_its_session_timeout_and_the_other_takes_its_partitions(
        raylog_client, kafka_config):
    topic = _topic(raylog_client, 4)
    group = f"kk-{uuid.uuid4().hex[:8]}"
    values = [f"k{i}".encode() for i in range(80)]
    _produce(raylog_client, topic, values, 4)
    survivor = _confluent(kafka_config, group)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, repr(_kafka_python_settings(kafka_config)), topic, group],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        survivor.subscribe([topic])
        # the child (kafka-python) holds two partitions, the survivor the two others
        deadline = time.monotonic() + WAIT_S
        while True:
            assert time.monotonic() < deadline and child.poll() is None, "the group never split in two"
            line = child.stdout.readline()
            assert line, "the kafka-python consumer exited"
            survivor.poll(0.05)
            if len(ast.literal_eval(line)) == 2 and len(_parts(survivor)) == 2:
                break
        os.killpg(child.pid, signal.SIGKILL)  # no LeaveGroup: only its session timeout tells
        child.wait(timeout=WAIT_S)
        got: dict = {}
        _poll_until([survivor], lambda: _parts(survivor) == {0, 1, 2, 3}, got, what="all four partitions")
        _poll_until([survivor], lambda: {m.value() for m in got.get(survivor, [])} >= set(values), got,
                    what="every message")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=WAIT_S)
        survivor.close()


def test_a_kafka_client_cannot_join_a_group_of_raylog_consumers(raylog_client, kafka_config):
    from kafka import KafkaConsumer
    from kafka.errors import InconsistentGroupProtocolError

    topic = _topic(raylog_client, 2)
    group = f"km-{uuid.uuid4().hex[:8]}"
    with raylog_client.consumer([topic], group=group) as raylog_consumer:
        raylog_consumer.poll(timeout_ms=100)
        intruder = _confluent(kafka_config, group)
        try:
            intruder.subscribe([topic])
            deadline = time.monotonic() + WAIT_S
            error = None
            while error is None and time.monotonic() < deadline:
                msg = intruder.poll(0.2)
                if msg is not None and msg.error() is not None:
                    error = msg.error()
            assert error is not None and error.code() == confluent_kafka.KafkaError.INCONSISTENT_GROUP_PROTOCOL
            assert intruder.assignment() == []
        finally:
            intruder.close()
        other = KafkaConsumer(topic, group_id=group, **_kafka_python_settings(kafka_config))
        try:
            with pytest.raises(InconsistentGroupProtocolError):
                other.poll(timeout_ms=int(WAIT_S * 1000))
        finally:
            other.close()
        # the raylog consumer keeps the whole topic
        assert raylog_consumer.assignment() == {(topic, 0), (topic, 1)}


def test_a_raylog_consumer_cannot_join_a_group_of_kafka_clients(raylog_client, kafka_config):
    from raylog.errors import MixedGroupError

    topic = _topic(raylog_client, 2)
    group = f"kr-{uuid.uuid4().hex[:8]}"
    member = _confluent(kafka_config, group)
    try:
        member.subscribe([topic])
        _poll_until([member], lambda: _parts(member) == {0, 1}, what="an assignment")
        with pytest.raises(MixedGroupError, match="Kafka-protocol member"):
            raylog_client.consumer([topic], group=group)
        assert _parts(member) == {0, 1}
    finally:
        member.close()
    # once the Kafka client left, the group is free for raylog consumers
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            consumer = raylog_client.consumer([topic], group=group)
            break
        except MixedGroupError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    consumer.close()


def test_commits_are_checked_against_the_group_on_the_wire(raylog_client, kafka_config, listeners):
    """One member over a raw connection: FindCoordinator, JoinGroup, SyncGroup,
    Heartbeat, OffsetCommit by generation and member id, LeaveGroup."""
    from kafka.protocol.consumer import (
        HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
        LeaveGroupResponse, OffsetCommitRequest, OffsetCommitResponse, SyncGroupRequest, SyncGroupResponse)
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
    from kafka_raw import RawKafka

    from raylog.groups import kafka_members
    from raylog.zk.paths import Paths

    topic = _topic(raylog_client, 1)
    group = f"kw-{uuid.uuid4().hex[:8]}"
    paths = Paths(raylog_client.settings.cluster)

    def commit(raw, generation, member_id, offset):
        Topic = OffsetCommitRequest.OffsetCommitRequestTopic
        request = OffsetCommitRequest[7](
            group_id=group, generation_id_or_member_epoch=generation, member_id=member_id, group_instance_id=None,
            topics=[Topic(name=topic, partitions=[Topic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")])])
        return raw.request(request, OffsetCommitResponse).topics[0].partitions[0].error_code

    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        found = raw.request(FindCoordinatorRequest[2](key=group, key_type=0), FindCoordinatorResponse)
        assert found.error_code == 0 and found.port in {e["port"] for e in listeners}
        Protocol = JoinGroupRequest.JoinGroupRequestProtocol
        joined = raw.request(JoinGroupRequest[5](
            group_id=group, session_timeout_ms=SESSION_MS, rebalance_timeout_ms=5000, member_id="",
            group_instance_id=None, protocol_type="consumer", protocols=[Protocol(name="range", metadata=b"md")]),
            JoinGroupResponse)
        assert joined.error_code == 0 and joined.leader == joined.member_id
        assert [(m.member_id, bytes(m.metadata)) for m in joined.members] == [(joined.member_id, b"md")]
        me, generation = joined.member_id, joined.generation_id
        # the members are visible in ZooKeeper while they are in the group
        assert list(kafka_members.live(raylog_client._zk, paths, group).values()) == [[me]]
        # joined but not synced yet: no commit (Kafka answers REBALANCE_IN_PROGRESS)
        assert commit(raw, generation, me, 7) == co.REBALANCE_IN_PROGRESS
        Assignment = SyncGroupRequest.SyncGroupRequestAssignment
        synced = raw.request(SyncGroupRequest[3](
            group_id=group, generation_id=generation, member_id=me, group_instance_id=None,
            assignments=[Assignment(member_id=me, assignment=b"all of it")]), SyncGroupResponse)
        assert synced.error_code == 0 and bytes(synced.assignment) == b"all of it"
        beat = HeartbeatRequest[3](group_id=group, generation_id=generation, member_id=me, group_instance_id=None)
        assert raw.request(beat, HeartbeatResponse).error_code == 0

        assert commit(raw, generation + 1, me, 7) == co.ILLEGAL_GENERATION
        assert commit(raw, generation, "somebody-else", 7) == co.UNKNOWN_MEMBER_ID
        assert commit(raw, -1, "", 7) == co.UNKNOWN_MEMBER_ID  # assign + commit into a live group
        assert _committed(raylog_client, group, topic) == {}  # none of them stored anything
        assert commit(raw, generation, me, 7) == co.NONE
        assert _committed(raylog_client, group, topic) == {0: 7}

        left = raw.request(LeaveGroupRequest[3](group_id=group, members=[
            LeaveGroupRequest.MemberIdentity(member_id=me, group_instance_id=None)]), LeaveGroupResponse)
        assert left.error_code == 0 and [m.error_code for m in left.members] == [0]
        assert raw.request(beat, HeartbeatResponse).error_code == co.UNKNOWN_MEMBER_ID
        assert kafka_members.live(raylog_client._zk, paths, group) == {}
        assert commit(raw, generation, me, 9) == co.UNKNOWN_MEMBER_ID
        assert commit(raw, -1, "", 9) == co.NONE  # an empty group takes assign + commit again
        assert _committed(raylog_client, group, topic) == {0: 9}
