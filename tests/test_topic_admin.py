"""Where a new topic's partitions go: round-robin from a node picked by the
stable hash of the topic's name (pure logic, no cluster)."""

from __future__ import annotations

import os
import subprocess
import sys

from crc32c import crc32c

from raylog.actors.placement import DiskNode
from raylog.topic_admin import place_partitions

DISKS = [DiskNode(identity=f"disk-{i}", node_id=f"n{i}", address=f"10.0.0.{i}", labelled=True) for i in range(3)]


def test_the_first_partition_goes_where_the_names_crc32c_points_and_the_rest_follow_round_robin():
    for topic in ("clicks", "views", "orders", "a", "b"):
        start = crc32c(topic.encode()) % len(DISKS)
        placed = place_partitions(topic, 5, DISKS)
        assert [d.identity for d in placed] == [DISKS[(start + p) % 3].identity for p in range(5)]


def test_placement_is_the_same_in_every_process():
    code = (
        "from raylog.actors.placement import DiskNode\n"
        "from raylog.topic_admin import place_partitions\n"
        "disks = [DiskNode(f'disk-{i}', f'n{i}', f'10.0.0.{i}', True) for i in range(3)]\n"
        "print([d.identity for d in place_partitions('clicks-and-views', 4, disks)])\n"
    )
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert runs == {str([d.identity for d in place_partitions("clicks-and-views", 4, DISKS)]) + "\n"}
