"""An idempotent producer's retry sent through a second listener after a
leader move is stored once (docs/design.md section 6, "whichever client,
listener or leader it went through"): a topic of replication factor 2 on two
disk nodes of a ``ray.cluster_utils.Cluster`` (in a process of its own, see
leader_move_idempotence.py), acks=all. A batch stored through the leader's
listener, the lead moved on purpose (a handoff) or by a failover (the
leader's partition actor killed), the same batch sent again through the
other listener: answered with the first store's offset, stored once; the
next sequence accepted, a gap refused with OUT_OF_ORDER_SEQUENCE_NUMBER;
raylog's consumer reads every record once. And confluent-kafka's idempotent
producer, bootstrapped at the second listener, delivers every message once
while the lead moves both ways. Real ZooKeeper, Ray, sockets and clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(900)

SCRIPT = Path(__file__).resolve().parent / "leader_move_idempotence.py"
OUT_OF_ORDER_SEQUENCE_NUMBER = 45


@pytest.fixture(scope="module")
def found(zookeeper, tmp_path_factory):
    if not zookeeper.running:
        zookeeper.start()
    data = tmp_path_factory.mktemp("leader-move") / "data"
    proc = subprocess.run([sys.executable, str(SCRIPT), zookeeper.connect_string, str(data)],
                          capture_output=True, text=True, timeout=840, env={**os.environ, "RAY_DEDUP_LOGS": "1"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("how", ["handoff", "failover"])
def test_a_retry_through_another_listener_after_a_leader_move_is_stored_once(found, how):
    case = found[how]
    assert case["moved"]["leader"] == case["other"] != case["leader"], case
    assert case["moved"]["epoch_after"] > case["moved"]["epoch_before"], case
    code, base = case["stored"]
    assert code == 0 and base >= 0, case
    assert case["again"] == [0, base], case  # the retry, through listener B: the first store's offset
    code, next_base = case["following"]
    assert code == 0 and next_base > base, case  # the next sequence is accepted
    assert case["gap"][0] == OUT_OF_ORDER_SEQUENCE_NUMBER, case
    assert case["again_following"] == [0, next_base], case
    assert case["read"] == [[base, f"{how}-a0"], [base + 1, f"{how}-a1"], [base + 2, f"{how}-a2"],
                            [next_base, f"{how}-b0"], [next_base + 1, f"{how}-b1"]], case


def test_confluent_idempotent_producer_through_the_second_listener_across_leader_moves(found):
    case = found["confluent"]
    count = case["count"]
    assert len(case["moves"]) == 2, case["moves"]  # a handoff, then a failover back
    assert all(m["epoch_after"] > m["epoch_before"] for m in case["moves"]), case["moves"]
    assert case["left"] == 0 and case["reported"] == count and not case["errors"], \
        {k: case[k] for k in ("left", "reported", "errors", "moves")}
    offsets = case["offsets"]
    assert offsets == sorted(set(offsets))
    read = case["read"]
    assert [value for _offset, value in read] == [f"c{i}" for i in range(count)], read[:5]
    assert [offset for offset, _value in read] == offsets
