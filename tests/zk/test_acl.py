"""ZooKeeper behind the token: raylog's nodes carry ACLs only token holders
can write, a forged endpoint learns nothing of the token, and a forged
tombstone cannot make the supervisor remove a directory that is not a
partition log. Real ZooKeeper, real Ray, real sockets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, Permissions

from raylog.errors import AuthenticationError, DeliveryError
from raylog.zk import acl
from raylog.zk.paths import Paths
from raylog.zk.registry import Registry
from raylog.zk.session import connect_kazoo

from tests.transfer.test_handshake import ForgedEndpoint, _derived_forms, _random_hello_reply

pytestmark = pytest.mark.timeout(600)


def _produce(client, topic: str, values: list[bytes]) -> None:
    producer = client.producer(acks=1)
    try:
        for value in values:
            producer.send(topic, value).result(timeout_s=60)
    finally:
        producer.close()


def _read(client, topic: str) -> list[bytes]:
    import ray

    from raylog.storage.decoding import decode_messages

    ray.get(client.partition_actor(topic, 0).flush.remote())
    host, port = client.metadata.endpoint(topic, 0, refresh=True)
    with client.settings.broker_connection(host, port) as conn:
        result = conn.fetch(topic, 0, 0, 1 << 20)
    return [r[3] for r in decode_messages(result.data, 0)[0]]


# -- the ACLs ------------------------------------------------------------------


def test_without_the_token_zookeeper_refuses_delete_tombstone_and_endpoint_writes(raylog_client, make_topic, zookeeper):
    topic = make_topic(partitions=1)
    _produce(raylog_client, topic, [b"kept-1", b"kept-2"])
    cluster = raylog_client.settings.cluster
    place = raylog_client.registry.placement(topic, 0)
    endpoint_before = raylog_client.registry.endpoint(topic, 0)
    stranger_zk = connect_kazoo(zookeeper.connect_string)  # no token: anyone who reaches ZooKeeper
    try:
        stranger = Registry(stranger_zk, cluster)
        assert topic in stranger.list_topics()  # readers without the token still read
        with pytest.raises(AuthenticationError, match="cluster's token"):
            stranger.delete_topic(topic)
        with pytest.raises(AuthenticationError, match="cluster's token"):
            stranger.add_tombstone(topic, 0, place["node"], "/etc")
        with pytest.raises(AuthenticationError, match="cluster's token"):
            stranger.register_endpoint(topic, 0, "127.0.0.1", 9, "forged", endpoint_before["epoch"] + 1)
        paths = Paths(cluster)
        for write in (
            lambda: stranger_zk.set(paths.endpoint(topic, 0), b'{"host": "127.0.0.1", "port": 9}'),
            lambda: stranger_zk.set(paths.topic(topic), b"{}"),
            lambda: stranger_zk.create(paths.topic("forged"), b"{}"),
            lambda: stranger_zk.delete(paths.endpoint(topic, 0)),
            lambda: stranger_zk.set_acls(paths.root, OPEN_ACL_UNSAFE),
        ):
            with pytest.raises(NoAuthError):
                write()
    finally:
        stranger_zk.stop()
        stranger_zk.close()
    # nothing was lost: the topic, its endpoint and its messages are intact, no tombstone
    assert raylog_client.registry.topic_exists(topic)
    assert raylog_client.registry.endpoint(topic, 0) == endpoint_before
    assert raylog_client.registry.tombstones() == {}
    assert _read(raylog_client, topic) == [b"kept-1", b"kept-2"]


def test_a_client_outside_ray_without_the_token_cannot_delete_a_topic(raylog_client, make_topic, zookeeper, tmp_path):
    topic = make_topic(partitions=1)
    _produce(raylog_client, topic, [b"still here"])
    script = (
        "import sys, raylog\n"
        "from raylog.client import Client\n"
        f"c = Client(zookeeper={zookeeper.connect_string!r}, cluster={raylog_client.settings.cluster!r})\n"
        "assert c.settings.token is None\n"
        f"print('topics', {topic!r} in c.list_topics())\n"
        "try:\n"
        f"    c.delete_topic({topic!r})\n"
        "except raylog.RaylogError as err:\n"
        "    print('refused', type(err).__name__, err)\n"
        "else:\n"
        "    print('deleted')\n"
        "c.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="disabled", HOME=str(tmp_path))  # no Ray, no Ray token: a stranger's process
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert "topics True" in done.stdout, done.stdout + done.stderr
    assert "refused AuthenticationError" in done.stdout, done.stdout + done.stderr
    assert raylog_client.registry.topic_exists(topic)
    assert raylog_client.registry.tombstones() == {}
    assert _read(raylog_client, topic) == [b"still here"]


def test_nodes_carry_the_cluster_acl_and_the_root_is_not_open(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    zk = raylog_client.registry.zk
    paths = Paths(raylog_client.settings.cluster)
    expected = acl.cluster_acl(raylog_client.settings.token, raylog_client.settings.cluster)
    for path in (paths.root, paths.topics, paths.topic(topic), paths.partition(topic, 0), paths.endpoint(topic, 0)):
        acls, _ = zk.get_acls(path)
        assert sorted(acls, key=str) == sorted(expected, key=str), path
    top, _ = zk.get_acls(acl.TOP)
    world = [a for a in top if a.id == acl.WORLD]
    assert world and all(a.perms & ~(Permissions.READ | Permissions.CREATE) == 0 for a in world)


def test_a_cluster_made_before_acls_is_secured_by_the_first_token_holder(private_zookeeper):
    hosts = private_zookeeper.connect_string
    paths = Paths("old")
    opened = connect_kazoo(hosts)  # as raylog wrote before: open ACLs
    try:
        opened.create(paths.topic("clicks"), b"{}", makepath=True)
        opened.create(paths.tombstones, b"", makepath=True)
        token = b"the-old-cluster-token"
        holder = connect_kazoo(hosts, token=token, cluster="old")
        try:
            for path in (paths.root, paths.topics, paths.topic("clicks"), paths.tombstones):
                assert holder.get_acls(path)[0] == acl.cluster_acl(token, "old"), path
            holder.set(paths.topic("clicks"), b'{"partitions": 1}')  # the holder still writes
        finally:
            holder.stop()
            holder.close()
        with pytest.raises(NoAuthError):
            opened.set(paths.topic("clicks"), b"{}")
        with pytest.raises(NoAuthError):
            opened.create(paths.tombstone("forged"), b"{}")
        # a session with another token does not take the root over, and may not write
        other = connect_kazoo(hosts, token=b"another-token", cluster="old")
        try:
            # (ZooKeeper shows another identity's digest as "x")
            assert [a.perms for a in other.get_acls(paths.root)[0] if a.id == acl.WORLD] == [Permissions.READ]
            assert Registry(other, "old").list_topics() == ["clicks"]
            with pytest.raises(AuthenticationError, match="cluster's token"):
                Registry(other, "old").add_tombstone("clicks", 0, "n", "/x")
        finally:
            other.stop()
            other.close()
    finally:
        opened.stop()
        opened.close()


def test_the_zookeeper_password_is_derived_not_the_token():
    token = b"t" * 64
    credential = acl.credential(token, "one")
    assert token.decode() not in credential
    for form in _derived_forms(token):
        assert form not in credential.encode()
    assert acl.password(token, "one") != acl.password(token, "two")


# -- a forged endpoint -----------------------------------------------------------


def test_a_producer_sent_to_a_forged_endpoint_reveals_nothing_and_fails_clearly(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    forged = ForgedEndpoint(_random_hello_reply)
    try:
        # a token holder's write, as a compromised ZooKeeper path would make it
        path = Paths(raylog_client.settings.cluster).endpoint(topic, 0)
        data, _ = raylog_client.registry.zk.get(path)
        endpoint = json.loads(data)
        endpoint.update(host=forged.address[0], port=forged.address[1])
        raylog_client.registry.zk.set(path, json.dumps(endpoint).encode())
        raylog_client.metadata.forget(topic, 0)
        producer = raylog_client.producer(acks=1)
        future = producer.send(topic, b"for the real partition only")
        with pytest.raises(AuthenticationError, match="did not prove that it holds the cluster's token"):
            future.result(timeout_s=120)
        with pytest.raises(DeliveryError, match="1 message lost .AuthenticationError"):
            producer.close(timeout_s=30)  # the loss is named again, not hidden
        assert forged.connections >= 1
        received = bytes(forged.received)
        assert received, "the producer never reached the forged endpoint"
        token = raylog_client.settings.token
        for form in _derived_forms(token):
            assert form not in received
        assert b"for the real partition only" not in received
    finally:
        forged.close()


# -- a forged tombstone ------------------------------------------------------------


def test_the_supervisor_refuses_to_remove_a_directory_that_is_not_a_partition_log(raylog_client, tmp_path):
    import ray

    from raylog.actors.supervisor import remove_deleted

    cluster = raylog_client.settings.cluster
    plain = tmp_path / "decoy"
    shaped = tmp_path / "data" / cluster / "gone-0"  # named like a partition log, but not one
    locked = tmp_path / "data2" / cluster / "gone-1"  # with a lock file, and a file raylog does not write
    for directory in (plain, shaped, locked):
        directory.mkdir(parents=True)
        (directory / "precious.txt").write_text("keep me")
    (locked / "lock").write_text("")
    (locked / "00000000000000000000.log").write_text("")
    node = "local"
    registry = raylog_client.registry
    registry.add_tombstone("gone", 0, node, str(plain))  # forged, by a token holder
    registry.add_tombstone("gone", 0, node, str(shaped))
    registry.add_tombstone("gone", 1, node, str(locked))
    rows = remove_deleted(registry, raylog_client.settings.zookeeper, ray.nodes(), topic="gone",
                          token=raylog_client.settings.token)
    assert [r["state"] for r in rows] == ["failed"] * 3, rows
    assert all("refusing to remove" in r["detail"] for r in rows), rows
    for directory in (plain, shaped, locked):
        assert (directory / "precious.txt").read_text() == "keep me", directory
    assert (locked / "00000000000000000000.log").exists()
    # refused once: the forged tombstones are gone, the next pass does not try again
    assert registry.tombstones() == {}


def test_a_real_partition_directory_passes_the_check(tmp_path):
    from raylog.actors.supervisor import partition_directory_problem, remove_log
    from raylog.config import TopicConfig
    from raylog.storage.log import PartitionLog
    from raylog.storage.message import encode_message_set

    log_dir = tmp_path / "c1" / "clicks-3"
    log = PartitionLog(str(log_dir), TopicConfig())
    log.append(encode_message_set([b"x"]))
    log.flush()
    log.close()
    assert partition_directory_problem(str(log_dir), "c1", "clicks", 3) is None
    assert partition_directory_problem(str(log_dir) + "/", "c1", "clicks", 3) is not None
    assert partition_directory_problem(str(log_dir), "c2", "clicks", 3) is not None
    assert partition_directory_problem(str(log_dir), "c1", "clicks", 4) is not None
    assert partition_directory_problem(str(log_dir), "c1", "../clicks", 3) is not None
    link = tmp_path / "c1" / "clicks-4"
    link.symlink_to(log_dir)
    assert "symbolic link" in partition_directory_problem(str(link), "c1", "clicks", 4)
    replica = tmp_path / "c1" / "clicks-3@disk-2"
    log = PartitionLog(str(replica), TopicConfig())
    log.close()
    assert partition_directory_problem(str(replica), "c1", "clicks", 3, "disk-2") is None
    assert remove_log(str(log_dir), remove_directory=True) and not log_dir.exists()


def test_every_launched_zookeeper_enforces_acls(tmp_path):
    """The embedded server, ``raylog zookeeper start`` and
    deploy/cluster_zookeeper.py all start ZooKeeper through this command line."""
    from raylog.zk.launcher import ServerSettings, command

    line = command(ServerSettings(data_dir=str(tmp_path), port=2181), "java", "cp")
    assert "-Dzookeeper.skipACL=no" in line
    assert "-Dzookeeper.DigestAuthenticationProvider.enabled=true" in line


# -- a server raylog launched: locked to its owner -----------------------------

OWNER = b"the machine's ray token"


def test_owner_and_cluster_identities_differ_and_derive_nothing_of_the_secret():
    token = b"t" * 64
    assert acl.owner_identity(OWNER) != acl.identity(token, "c1")
    assert acl.owner_identity(OWNER) != acl.owner_identity(b"another secret")
    assert OWNER.decode() not in acl.owner_credential(OWNER)
    assert acl.locked_acl(OWNER) == [acl.ACL(Permissions.ALL, acl.owner_identity(OWNER)), acl.WORLD_READ]


def test_a_locked_server_takes_writes_from_its_owner_and_admitted_clusters_only(tmp_path, monkeypatch):
    from raylog.errors import ClusterPathTakenError, EmbeddedZooKeeperError
    from raylog.zk.server import EmbeddedZooKeeper

    token = b"c1-token"
    with EmbeddedZooKeeper(data_dir=str(tmp_path / "zk"), owner_secret=OWNER) as server:
        stranger = connect_kazoo(server.connect_string)
        try:
            for path in ("/junk", "/raylog/c1", "/zookeeper/junk", "/zookeeper/quota/junk"):
                with pytest.raises(NoAuthError):
                    stranger.create(path, b"x")
            for path in ("/", "/raylog", "/zookeeper"):
                with pytest.raises(NoAuthError):
                    stranger.set(path, b"x")
                # (ZooKeeper shows a digest's hash to the node's admins only)
                owner = acl.ACL(Permissions.ALL, acl.Id("digest", f"{acl.OWNER_USER}:x"))
                assert stranger.get_acls(path)[0] == [owner, acl.WORLD_READ]
            # the owner makes a cluster's root; the cluster's session then writes below it only
            server.admit(token, "c1")
            holder = connect_kazoo(server.connect_string, token=token, cluster="c1")
            try:
                holder.create("/raylog/c1/topics", b"")
                with pytest.raises(NoAuthError):
                    holder.create("/raylog/c2", b"")
            finally:
                holder.stop()
                holder.close()
            # a cluster the owner did not admit, from a process without the owner's secret
            monkeypatch.setattr(acl, "owner_secret", lambda: None)
            with pytest.raises(ClusterPathTakenError, match="/raylog"):
                connect_kazoo(server.connect_string, token=b"c2-token", cluster="c2")
            # ... and with it (a holder of this machine's Ray token)
            monkeypatch.setattr(acl, "owner_secret", lambda: OWNER)
            other = connect_kazoo(server.connect_string, token=b"c2-token", cluster="c2")
            try:
                other.create("/raylog/c2/topics", b"")
            finally:
                other.stop()
                other.close()
            assert sorted(stranger.get_children("/raylog")) == ["c1", "c2"]
            assert sorted(stranger.get_children("/")) == ["raylog", "zookeeper"]
        finally:
            stranger.stop()
            stranger.close()
    # the lock is kept with the data: another owner cannot take the server over
    with pytest.raises(EmbeddedZooKeeperError, match="another owner"):
        EmbeddedZooKeeper(data_dir=str(tmp_path / "zk"), owner_secret=b"someone else").start()
