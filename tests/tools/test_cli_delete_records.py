"""``raylog topics delete-records`` (client.delete_records) through the
installed console script against the shared ZooKeeper and the session's
Ray (see test_cli.py): a partition's records before the offset are gone and
its log start is there; an offset past the high watermark exits 1 naming
the bounds, and nothing changes."""

from __future__ import annotations

import pytest

from test_cli import assert_one_error_line, raylog  # noqa: E402 - the runner of test_cli.py

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster(zookeeper, ray_local, raylog_client):
    if not zookeeper.running:
        zookeeper.start()
    return ["--zookeeper", zookeeper.connect_string, "--ray-address", ray_local.get_runtime_context().gcs_address,
            "--cluster", raylog_client.settings.cluster]


def _fill(client, name: str, count: int) -> list[int]:
    producer = client.producer(acks="all")
    futures = [producer.send(name, b"m-%d" % i, partition=0) for i in range(count)]
    producer.flush(30)
    producer.close()
    return [f.result(30).offset for f in futures]


def test_an_offset_past_the_high_watermark_exits_1_naming_the_bounds_and_deletes_nothing(cluster, raylog_client,
                                                                                           make_topic):
    name = make_topic(partitions=1)
    _fill(raylog_client, name, 5)
    before = raylog_client.offsets(name, 0)
    assert_one_error_line(raylog(*cluster, "topics", "delete-records", name, "--partition", "0", "--offset",
                                 str(before[1] + 1)), 1, f"outside [0, {before[1]}]")
    assert raylog_client.offsets(name, 0) == before


def test_delete_records_moves_the_log_start(cluster, raylog_client, make_topic):
    name = make_topic(partitions=1)
    offsets = _fill(raylog_client, name, 5)
    proc = raylog(*cluster, "topics", "delete-records", name, "--partition", "0", "--offset", str(offsets[3]))
    assert proc.returncode == 0, proc.stderr
    assert f"Partition {name}-0 now starts at offset {offsets[3]}" in proc.stdout
    assert raylog_client.offsets(name, 0)[0] == offsets[3]
