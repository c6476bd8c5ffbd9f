"""Every wrong call is diagnosed by its real cause: a typed raylog error
whose message names the argument or address at fault and says what to do,
raised before anything is queued, stored or started; what was accepted
before and after stays intact.

The connection cases run in a subprocess (this process may already hold a
Ray, and ``connect`` then skips ``ray.init``): each must fail within the
connection deadline with one line and nothing of Ray's on stderr.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

import raylog
from raylog.config import EARLIEST
from raylog.errors import ArgumentTypeError, ClosedError, ConfigError, RaylogError, UnknownTopicError
from raylog.zk.launcher import free_port

#: a wrong address must fail well within this (Ray's own join takes 20 s
#: and more against a listener that is no GCS, and minutes against none)
FAIL_WITHIN_S = 30.0
#: the subprocess is killed after this (a hang is then a clear failure)
KILL_AFTER_S = 120.0
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAY_ADDRESS",
             "RAYLOG_LOG_LEVEL")


def _read_all(client, topic: str, count: int, timeout_s: float = 60.0) -> list:
    consumer = client.consumer(topic, auto_offset_reset=EARLIEST)
    got = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=500))
    finally:
        consumer.close()
    return got


# -- the arguments of a call ---------------------------------------------------------


@pytest.mark.parametrize("compiled", [True, False], ids=["c", "python"])
def test_a_str_key_is_refused_naming_the_key_and_how_to_encode_it(raylog_client, make_topic, monkeypatch, compiled):
    """A keyed send goes through the compiled send (its fall-back to the
    reference) or the reference alone: the same error either way."""
    import raylog.producer.producer as producer_module

    if not compiled:
        monkeypatch.setattr(producer_module, "_fastsend", None)
    elif producer_module._fastsend is None:
        pytest.skip("built without the compiled send")
    topic = make_topic(partitions=2)
    producer = raylog_client.producer()
    try:
        producer.send(topic, b"before", key=b"k").result(timeout_s=60)
        with pytest.raises(ArgumentTypeError, match=r"^key must be bytes, got str; encode it, e\.g\. key\.encode\(\)$") as err:
            producer.send(topic, b"v", key="k")
        assert isinstance(err.value, TypeError) and isinstance(err.value, RaylogError)
        with pytest.raises(ArgumentTypeError, match=r"keys must be bytes or None, got str; encode them, e\.g\. key\.encode\(\)"):
            producer.send_batch(topic, [b"a", b"b"], [b"k1", "k2"])
        with pytest.raises(ArgumentTypeError, match=r"value must be bytes \(or None for a tombstone\), got str; encode it first"):
            producer.send(topic, "v", key=b"k")
        producer.send(topic, b"after", key=b"k").result(timeout_s=60)
    finally:
        producer.close()
    assert sorted(m.value for m in _read_all(raylog_client, topic, 2)) == [b"after", b"before"]


def test_a_topic_that_is_not_a_str_is_named_as_the_argument(raylog_client, make_topic):
    with pytest.raises(ArgumentTypeError, match=r"topic name must be a str, got NoneType"):
        raylog_client.create_topic(None)
    producer = raylog_client.producer()
    try:
        with pytest.raises(ArgumentTypeError, match=r"topic must be a str .*got NoneType"):
            producer.send(None, b"x").result(timeout_s=30)
        with pytest.raises(ArgumentTypeError, match=r"topic must be a str .*got NoneType"):
            producer.send(None, b"x", key=b"k").result(timeout_s=30)
    finally:
        producer.close()
    with pytest.raises(ArgumentTypeError, match=r"topic must be a str .*got int"):
        raylog_client.consumer([7])


def test_too_many_partitions_is_a_config_error_with_the_maximum_before_zookeeper(raylog_client, monkeypatch):
    from raylog.admin.topics import MAX_PARTITIONS

    name = f"huge-{uuid.uuid4().hex[:8]}"

    def untouchable(*args, **kwargs):
        raise AssertionError("ZooKeeper was asked")

    with monkeypatch.context() as patch:
        patch.setattr(raylog_client.registry, "create_topic", untouchable)
        patch.setattr(raylog_client.registry, "tombstones", untouchable)
        for partitions in (10**6, MAX_PARTITIONS + 1, 0):
            with pytest.raises(ConfigError, match=rf"partitions must be between 1 and {MAX_PARTITIONS}\b.*got {partitions}"):
                raylog_client.create_topic(name, partitions=partitions)
        with pytest.raises(ArgumentTypeError, match="partitions must be an int, got str"):
            raylog_client.create_topic(name, partitions="3")
        with pytest.raises(ConfigError, match="invalid topic name"):
            raylog_client.create_topic("no spaces", partitions=1)
    assert name not in raylog_client.list_topics()
    assert MAX_PARTITIONS == 1024  # the documented bound


def test_sending_to_a_deleted_topic_is_an_unknown_topic_error_naming_it(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1)
    try:
        assert producer.send(topic, b"kept").result(timeout_s=60) is not None
        raylog_client.delete_topic(topic)
        future = producer.send(topic, b"after delete")
        with pytest.raises(UnknownTopicError, match=rf"topic '{topic}' no longer exists .*deleted"):
            future.result(timeout_s=60)
    finally:
        try:
            producer.close()
        except RaylogError:
            pass  # the message above is reported again as not delivered
    assert topic not in raylog_client.list_topics()


def test_a_closed_client_says_it_is_closed(zookeeper):
    from raylog.client import Client

    client = Client(zookeeper=zookeeper.connect_string, cluster=f"closed-{uuid.uuid4().hex[:8]}")
    assert client.list_topics() == []
    client.close()
    for call in (client.list_topics, lambda: client.describe_topic("t"), lambda: client.create_topic("t")):
        with pytest.raises(ClosedError, match="the client is closed; call raylog.connect"):
            call()


# -- addresses -----------------------------------------------------------------------


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    env.update(extra)
    return env


def _connect_in_subprocess(call: str, prefix: tuple = (), env=None):
    script = textwrap.dedent(
        f"""
        import time
        import raylog
        start = time.monotonic()
        try:
            {call}
        except raylog.RaylogError as err:
            print(type(err).__name__, f"{{time.monotonic() - start:.1f}}", sep="\\n")
            print(err)
            raise SystemExit(3)
        raise SystemExit("connected?!")
        """
    )
    try:
        proc = subprocess.run([*prefix, sys.executable, "-c", script], capture_output=True, text=True,
                              env=env or _env(), timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"still ran after {KILL_AFTER_S:g} s: {hung.stderr!r}")
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    name, elapsed, *message = proc.stdout.splitlines()
    assert len(message) == 1, proc.stdout  # one line
    assert float(elapsed) < FAIL_WITHIN_S, f"took {elapsed} s"
    assert proc.stderr == "", proc.stderr  # nothing of Ray's (gcs_client retries) or kazoo's
    return name, message[0]


def test_a_zookeeper_port_out_of_range_is_a_config_error_naming_it():
    name, message = _connect_in_subprocess("raylog.connect(zookeeper='127.0.0.1:99999', ray_address='127.0.0.1:1')")
    assert name == "ConfigError"
    assert "'99999'" in message and "1..65535" in message
    with pytest.raises(ConfigError, match="has no host"):
        raylog.Client(zookeeper=":2181")


class _Listener:
    """A TCP listener on this machine that is no Ray GCS: it accepts and says
    nothing (``reply=None``), or says ``reply`` and closes."""

    def __init__(self, reply: bytes | None, host: str):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._held: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.reply is None:
                self._held.append(conn)  # open and silent
            else:
                try:
                    conn.sendall(self.reply)
                except OSError:
                    pass
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


@pytest.mark.parametrize("kind", ["refused", "silent", "garbage", "http"])
def test_every_kind_of_wrong_ray_address_is_ray_unavailable_within_the_deadline(zookeeper, kind):
    """Nothing listening, a listener that never answers, one that answers
    with garbage, and one that speaks another protocol: each is one line of
    RayUnavailableError naming the address, within the deadline, with no
    log line of Ray's."""
    replies = {"silent": None, "garbage": b"\x00\xff garbage \r\n" * 10,
               "http": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"}
    from raylog.ray_join import ray_head

    # Ray joins 127.0.0.1 at this machine's own address: listen there
    host = ray_head("127.0.0.1:1")[0]
    listener = None
    if kind == "refused":
        address = f"127.0.0.1:{free_port()}"
    else:
        listener = _Listener(replies[kind], host)
        address = f"127.0.0.1:{listener.port}"
    try:
        name, message = _connect_in_subprocess(
            f"raylog.connect(zookeeper={zookeeper.connect_string!r}, ray_address={address!r})")
    finally:
        if listener is not None:
            listener.close()
    assert name == "RayUnavailableError"
    assert repr(address) in message and "ray status" in message
    if listener is not None:
        assert listener.accepted >= 1
        assert "gRPC" in message, message  # it answered TCP: the message says what was wrong


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (a PID namespace of the test's own)")
def test_auto_with_no_ray_running_is_ray_unavailable_with_advice(zookeeper, tmp_path):
    """Run where no Ray process is visible (a PID and user namespace of the
    test's own; other Ray clusters on this machine are outside it) and no
    'ray start' left an address."""
    probe = subprocess.run(["unshare", "-rpf", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare cannot make a PID namespace here: {probe.stderr!r}")
    env = _env(TMPDIR=str(tmp_path), RAY_TMPDIR=str(tmp_path))
    name, message = _connect_in_subprocess(
        f"raylog.connect(zookeeper={zookeeper.connect_string!r}, ray_address='auto')",
        prefix=("unshare", "-rpf", "--mount-proc"), env=env)
    assert name == "RayUnavailableError"
    assert "ray_address='auto' found no running Ray cluster" in message and "ray start --head" in message
