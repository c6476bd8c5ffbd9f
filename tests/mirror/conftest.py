"""Two raylog clusters for the mirror tests: the module's ``raylog_client``
is the target; ``source`` is a second cluster (another name and data
directory) on the same ZooKeeper and Ray."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="module")
def source(zookeeper, ray_local, tmp_path_factory):
    from raylog.client import Client

    client = Client(zookeeper=zookeeper.connect_string, cluster=f"src-{uuid.uuid4().hex[:12]}",
                    data_dir=str(tmp_path_factory.mktemp("raylog-source")), data_host="127.0.0.1")
    try:
        yield client
    finally:
        try:
            for topic in client.list_topics():
                client.delete_topic(topic)
        finally:
            client.close()
