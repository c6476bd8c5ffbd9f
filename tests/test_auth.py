"""Closed by default: every data port and every control call of a partition
requires the cluster token, which no one has to set up. Real Ray, real
ZooKeeper, real sockets."""

from __future__ import annotations

import os

import pytest

from raylog import auth
from raylog.errors import AuthenticationError
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer.connection import BrokerConnection


def test_the_derived_token_depends_on_the_ray_token_and_the_cluster():
    a = auth.derive(b"ray-token", "one")
    assert a == auth.derive(b"ray-token", "one") and len(a) == 64
    assert a != auth.derive(b"ray-token", "two")
    assert a != auth.derive(b"other-ray-token", "one")


def test_outside_ray_the_ray_token_is_read_as_ray_reads_it(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env\n")
    assert auth._ray_token_outside_ray() == b"from-env"
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    path = tmp_path / "token"
    path.write_text("from-file\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    assert auth._ray_token_outside_ray() == b"from-file"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert auth._ray_token_outside_ray() is None


def test_a_client_gets_the_cluster_token_without_any_set_up(raylog_client):
    token = raylog_client.settings.token
    assert token and token == auth.cluster_token(raylog_client.settings.cluster)


@pytest.fixture
def served(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
    with BrokerConnection(host, port, token=raylog_client.settings.token) as conn:
        conn.produce(topic, 0, encode_message_set([b"accepted"]))
    return topic, host, port


def intact(raylog_client, topic: str) -> list[bytes]:
    import ray

    ray.get(raylog_client.partition_actor(topic, 0).flush.remote())
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
    with BrokerConnection(host, port, token=raylog_client.settings.token) as conn:
        result = conn.fetch(topic, 0, 0, 1 << 20)
    return [r[3] for r in decode_messages(result.data, 0)[0]]


@pytest.mark.parametrize("token", [None, b"guess"], ids=["no-token", "wrong-token"])
def test_a_client_without_the_token_is_refused_on_produce_fetch_and_offsets(raylog_client, served, token):
    topic, host, port = served
    calls = {
        "produce": lambda c: c.produce(topic, 0, encode_message_set([b"intruder"])),
        "fetch": lambda c: c.fetch(topic, 0, 0, 4096),
        "offsets": lambda c: c.offsets(topic, 0),
    }
    for name, call in calls.items():
        with BrokerConnection(host, port, token=token, timeout_s=10) as conn:
            with pytest.raises(AuthenticationError):
                call(conn)
    assert intact(raylog_client, topic) == [b"accepted"]


@pytest.mark.parametrize("token", [None, b"guess"], ids=["no-token", "wrong-token"])
def test_a_client_without_the_token_is_refused_on_control_calls(raylog_client, served, token, zookeeper, monkeypatch):
    import ray

    from raylog.actors.partition import start_partition_actor
    from raylog.client import Client

    topic, _host, _port = served
    cluster = raylog_client.settings.cluster
    if token is None:
        # a process that cannot derive the token (not in Ray, no Ray token)
        monkeypatch.setattr(auth, "cluster_token", lambda c: None)
    intruder = Client(zookeeper=zookeeper.connect_string, cluster=cluster, data_dir=raylog_client.data_dir, token=token)
    monkeypatch.undo()
    try:
        assert intruder.settings.token == token
        with pytest.raises(AuthenticationError):
            intruder.repair(topic)
        with pytest.raises(AuthenticationError):
            intruder.delete_topic(topic)
        actor = raylog_client.partition_actor(topic, 0)
        with pytest.raises(AuthenticationError):
            ray.get(actor.shutdown.remote(delete_data=True, token=token))
        # an actor started with a token that is not the cluster's refuses to serve
        place = raylog_client.registry.placement(topic, 0)
        # (Ray reports the constructor's AuthenticationError as the actor's death)
        with pytest.raises(Exception, match="the caller's token is not the token of cluster"):
            handle = start_partition_actor(
                zookeeper=zookeeper.connect_string, cluster=cluster, topic=topic + "-x", partition=0,
                log_dir=place["log_dir"] + "-x", config=raylog_client.registry.topic_config(topic),
                node_identity=place["node"], nodes=ray.nodes(), host="127.0.0.1", token=b"guess",
            )
            try:
                ray.get(handle.ping.remote(), timeout=60)
            finally:
                ray.kill(handle, no_restart=True)
    finally:
        intruder.close()
    assert topic in raylog_client.list_topics()
    assert intact(raylog_client, topic) == [b"accepted"]


EMBEDDED_WITHOUT_RAY_TOKEN = r"""
import raylog
from raylog import auth
from raylog.errors import AuthenticationError
from raylog.storage.message import encode_message_set
from raylog.transfer.connection import BrokerConnection

client = raylog.connect(num_cpus=1)
try:
    token = client.settings.token
    assert token is not None and auth._ray_token() == (True, None), "no Ray token: the key-value secret"
    client.create_topic("t", partitions=1)
    host, port = client.metadata.endpoint("t", 0)
    with BrokerConnection(host, port, token=token) as conn:
        conn.produce("t", 0, encode_message_set([b"v"]), acks=1)
    try:
        with BrokerConnection(host, port) as conn:
            conn.offsets("t", 0)
    except AuthenticationError:
        print("REFUSED")
finally:
    client.close()
"""


def test_without_ray_token_authentication_the_embedded_default_is_closed_too(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLOG_", "RAY_"))}
    env.update(RAY_AUTH_MODE="disabled", HOME=str(tmp_path))  # no ~/.ray/auth_token either
    proc = subprocess.run(
        [sys.executable, "-c", EMBEDDED_WITHOUT_RAY_TOKEN], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout
