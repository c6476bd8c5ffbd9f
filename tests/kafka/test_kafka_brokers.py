"""The listeners' registry in ZooKeeper (real ZooKeeper, no Ray)."""

from __future__ import annotations

import json

import pytest

from raylog.errors import BrokerUnavailableError
from raylog.kafka import brokers
from raylog.kafka.service import kafka_config
from raylog.zk.paths import Paths


def test_register_list_replace_and_unregister(zk, make_zk, cluster_name):
    paths = Paths(cluster_name)
    other = make_zk()
    first = brokers.register(other, paths, "disk-a", "10.0.0.1", 9092)
    assert first["broker_id"] == brokers.broker_id("disk-a") and 0 <= first["broker_id"] < 2**31
    assert zk.exists(f"/raylog/{cluster_name}/kafka/listeners/disk-a")
    # a restarted listener (another session) replaces the node of the one before
    again = brokers.register(zk, paths, "disk-a", "10.0.0.1", 9093)
    brokers.register(zk, paths, "disk-b", "10.0.0.2", 9092)
    other.stop()
    other.close()  # the old session's end leaves the new node alone
    assert brokers.listeners(zk, paths) == {"disk-a": again, "disk-b": brokers.listeners(zk, paths)["disk-b"]}
    brokers.unregister(zk, paths, "disk-b")
    assert list(brokers.listeners(zk, paths)) == ["disk-a"]


def test_the_leader_listener_follows_the_replication_state_then_the_placement(zk, cluster_name):
    paths = Paths(cluster_name)
    found = {"a": {"node": "a", "host": "h1"}, "b": {"node": "b", "host": "h2"}}
    zk.create(paths.partition("t", 0), json.dumps({"node": "a", "log_dir": "/d"}).encode(), makepath=True)
    assert brokers.leader_listener(zk, paths, "t", 0, found, None)["node"] == "a"
    zk.create(paths.state("t", 0), json.dumps({"leader": "b"}).encode())
    assert brokers.leader_listener(zk, paths, "t", 0, found, None)["node"] == "b"
    # a node without a listener: the one on the endpoint's host
    assert brokers.leader_listener(zk, paths, "u", 0, found, {"host": "h2"})["node"] == "b"


def test_kafka_config_without_listeners_is_a_clear_error(zk, cluster_name):
    with pytest.raises(BrokerUnavailableError, match="start_kafka_listeners"):
        kafka_config(zk, Paths(cluster_name), cluster_name, b"t" * 64, wait_s=0.2)
    brokers.register(zk, Paths(cluster_name), "disk-a", "127.0.0.1", 9092)
    assert kafka_config(zk, Paths(cluster_name), cluster_name, None) == {
        "bootstrap.servers": "127.0.0.1:9092", "security.protocol": "PLAINTEXT"}


def test_kafka_config_follows_the_security_the_listeners_registered(zk, cluster_name, tmp_path, monkeypatch):
    from raylog.errors import ConfigError
    from raylog.kafka.tls import TlsSettings, ca_pem

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    paths, token = Paths(cluster_name), b"t" * 64
    pem = ca_pem(TlsSettings.make(tmp_path / "certs"))
    tls = {"security_protocol": "SASL_SSL", "ssl_ca": pem}
    brokers.register(zk, paths, "disk-a", "127.0.0.1", 9092, tls)
    brokers.register(zk, paths, "disk-b", "127.0.0.1", 9093, tls)
    config = kafka_config(zk, paths, cluster_name, token, mechanism="SCRAM-SHA-512")
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.mechanisms"] == "SCRAM-SHA-512"
    assert open(config["ssl.ca.location"]).read() == pem
    assert kafka_config(zk, paths, cluster_name, None) == {  # a cluster opened on purpose: TLS alone
        "bootstrap.servers": "127.0.0.1:9092,127.0.0.1:9093", "security.protocol": "SSL",
        "ssl.ca.location": config["ssl.ca.location"]}
    # a listener that says otherwise (started without TLS, or with another CA): named, not guessed
    brokers.register(zk, paths, "disk-b", "127.0.0.1", 9093, {"security_protocol": "SASL_PLAINTEXT"})
    with pytest.raises(ConfigError, match="disagree on TLS.*disk-a: SASL_SSL, disk-b: SASL_PLAINTEXT"):
        kafka_config(zk, paths, cluster_name, token)
    brokers.register(zk, paths, "disk-b", "127.0.0.1", 9093, {**tls, "ssl_ca": "another"})
    with pytest.raises(ConfigError, match="disagree on TLS or its CA"):
        kafka_config(zk, paths, cluster_name, token)
    # a certificate of a public CA (none registered): the client's own trust store
    brokers.register(zk, paths, "disk-a", "127.0.0.1", 9092, {"security_protocol": "SASL_SSL"})
    brokers.register(zk, paths, "disk-b", "127.0.0.1", 9093, {"security_protocol": "SASL_SSL"})
    assert "ssl.ca.location" not in kafka_config(zk, paths, cluster_name, token)


def test_replicas_and_isr_are_the_replication_states_as_broker_ids(zk, cluster_name):
    from raylog.zk.partition_state import PartitionState

    paths = Paths(cluster_name)
    a, b, c = (brokers.broker_id(n) for n in ("a", "b", "c"))
    assert brokers.replica_ids(zk, paths, "t", 0, a) == ([a], [a])  # not replicated: the leader alone
    state = PartitionState("b", 3, ("b", "c"), ("a", "b", "c"))
    zk.create(paths.state("t", 0), state.to_json(), makepath=True)
    assert brokers.replica_ids(zk, paths, "t", 0, b) == ([a, b, c], [b, c])
    # the leader's node has no listener: the listener Metadata names leads in both lists, once
    assert brokers.replica_ids(zk, paths, "t", 0, c) == ([a, c], [c])
    zk.create(paths.state("t", 1), json.dumps({"leader": "b"}).encode(), makepath=True)
    assert brokers.replica_ids(zk, paths, "t", 1, b) == ([b], [b])  # a state it cannot read: the leader alone
