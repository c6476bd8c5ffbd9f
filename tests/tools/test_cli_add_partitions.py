"""``raylog topics add-partitions`` (client.add_partitions) through the
installed console script against the shared ZooKeeper and the session's
Ray (see test_cli.py): a live topic grows and serves the new partitions;
a count not larger than now exits 2 naming the count, an unknown topic
exits 1, and nothing changes."""

from __future__ import annotations

import uuid

import pytest

from test_cli import assert_one_error_line, raylog  # noqa: E402 - the runner of test_cli.py

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster(zookeeper, ray_local, raylog_client):
    if not zookeeper.running:
        zookeeper.start()
    return ["--zookeeper", zookeeper.connect_string, "--ray-address", ray_local.get_runtime_context().gcs_address,
            "--cluster", raylog_client.settings.cluster]


def test_add_partitions_grows_a_live_topic(cluster, raylog_client, make_topic):
    name = make_topic(partitions=2)
    proc = raylog(*cluster, "topics", "add-partitions", name, "--partitions", "5")
    assert proc.returncode == 0, proc.stderr
    assert f"Topic {name} now has 5 partitions (partitions 2..4 added)." in proc.stdout
    rows = raylog_client.describe_topic(name)["partitions"]
    assert [row["partition"] for row in rows] == [0, 1, 2, 3, 4] and all(row["served"] for row in rows)


def test_a_count_not_larger_and_an_unknown_topic_are_refused_and_change_nothing(cluster, raylog_client, make_topic):
    name = make_topic(partitions=3)
    assert_one_error_line(raylog(*cluster, "topics", "add-partitions", name, "--partitions", "3"), 2,
                          f"topic '{name}' has 3 partitions; the new total must be larger")
    assert raylog_client.describe_topic(name)["config"].partitions == 3
    missing = f"t-{uuid.uuid4().hex[:12]}"
    proc = raylog(*cluster, "topics", "add-partitions", missing, "--partitions", "2")
    assert proc.returncode == 1 and missing in proc.stderr, proc.stderr
    assert missing not in raylog_client.list_topics()
    proc = raylog(*cluster, "topics", "add-partitions", name)
    assert proc.returncode == 2 and "--partitions" in proc.stderr
