"""docs/howto/operations.md, "What listens where": a partition actor's data port is bound
to one address, never every interface, and the address it advertises in
ZooKeeper is exactly the one it bound: 127.0.0.1 where the client asks for
it (the embedded default), else the node's address as Ray knows it."""

from __future__ import annotations

import uuid

import psutil
import pytest

from raylog.client import Client

WILDCARDS = {"0.0.0.0", "::"}


def _listeners_on(port: int) -> set[str]:
    """Addresses with a listening TCP socket on ``port`` on this machine."""
    return {c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


@pytest.mark.parametrize("data_host", ["127.0.0.1", None], ids=["embedded-loopback", "node-address"])
def test_a_partition_binds_one_address_and_advertises_that_one(zookeeper, ray_local, tmp_path, data_host):
    if not zookeeper.running:
        zookeeper.start()
    client = Client(zookeeper=zookeeper.connect_string, cluster=f"listen-{uuid.uuid4().hex[:12]}",
                    data_dir=str(tmp_path), data_host=data_host)
    try:
        client.create_topic("t", partitions=1)
        endpoint = client.registry.endpoints("t")[0]
        expected = data_host or ray_local.util.get_node_ip_address()
        assert endpoint["host"] == expected
        bound = _listeners_on(endpoint["port"])
        assert bound == {expected}, bound  # that address alone, no wildcard
        assert not bound & WILDCARDS
    finally:
        try:
            client.delete_topic("t")
        finally:
            client.close()
