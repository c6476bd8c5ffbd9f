"""Throughput with replication factor 1 and 3, side by side, in one run.

A local multi-node cluster (``ray.cluster_utils.Cluster``, three disk nodes,
see ``bench/disk_cluster.py``). For each replication factor, a one-partition
topic per acks level: one producer sends N 200-byte messages (``send``, batch
50, as bench/throughput.py's "produce batch 50") with ``acks=1`` and with
``acks="all"``; the clock stops when the partition's high watermark covers
every byte (with replication: on every in-sync replica). Then one consumer
reads the ``acks=1`` topic back (from the leader, up to the high watermark).
RF 1 and RF 3 are alternated over ``--rounds`` rounds and the best of each
is kept (the machine may be shared).

Prints one JSON line per measurement (the same fields as bench/throughput.py),
a line of ratios RF3/RF1, then a table. Usage::

    python bench/replication.py [-n 200000] [--rounds 3] [--json-only]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from disk_cluster import disk_cluster  # noqa: E402 - beside this file
from throughput import MESSAGE, _best, _uptime, _wait_until_stored, bench_consume  # noqa: E402

ACKS = (1, "all")
FACTORS = (1, 3)


def bench_produce(client, topic: str, n: int, acks, factor: int) -> dict:
    start_hw = client.offsets(topic, 0)[1]
    producer = client.producer(batch_size=50, linger_ms=5, acks=acks, max_buffered_messages=200_000)
    t0 = time.perf_counter()
    send = producer.send
    for _ in range(n):
        send(topic, MESSAGE)
    producer.flush()
    sent_s = time.perf_counter() - t0
    seconds = _wait_until_stored(client, topic, {0: start_hw}, n) - t0
    producer.close()
    return {
        "case": f"RF{factor} produce batch 50, acks={acks}", "replication_factor": factor, "acks": acks,
        "messages": n, "seconds": round(seconds, 3), "send_seconds": round(sent_s, 3),
        "msg_per_s": round(n / seconds), "mb_per_s": round(n * len(MESSAGE) / seconds / 1e6, 2),
    }


def topic_name(factor: int, acks) -> str:
    return f"rf{factor}-acks{acks}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--messages", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds; the best of each case is kept")
    p.add_argument("--json-only", action="store_true")
    args = p.parse_args(argv)
    n = args.messages
    from tqdm import tqdm

    load_before, uptime_before = os.getloadavg(), _uptime()
    measured: dict[str, list] = {}
    with disk_cluster(3, name="bench-replication") as (_cluster, _nodes, client):
        for factor in FACTORS:
            for acks in ACKS:
                client.create_topic(topic_name(factor, acks), partitions=1, replication_factor=factor,
                                    min_insync_replicas=min(2, factor))
                bench_produce(client, topic_name(factor, acks), 1000, acks, factor)  # warm-up: connections, caches
        steps = [(r, f) for r in range(args.rounds) for f in FACTORS]
        for _round, factor in tqdm(steps, desc="replication", unit="case", file=sys.stderr):
            for acks in ACKS:
                row = bench_produce(client, topic_name(factor, acks), n, acks, factor)
                measured.setdefault(row["case"], []).append(row)
            row = bench_consume(client, topic_name(factor, 1), n)  # a fresh consumer: the first n from the start
            row.update(case=f"RF{factor} consume (poll)", replication_factor=factor)
            measured.setdefault(row["case"], []).append(row)
    rows = [_best(v) for v in measured.values()]
    for row in rows:
        print(json.dumps(row), flush=True)
    by_case = {r["case"]: r for r in rows}
    ratios = {}
    for what in [f"produce batch 50, acks={a}" for a in ACKS] + ["consume (poll)"]:
        ratios[what] = round(by_case[f"RF3 {what}"]["msg_per_s"] / by_case[f"RF1 {what}"]["msg_per_s"], 2)
    summary = {"case": "ratios RF3/RF1", **ratios, "cpus": os.cpu_count(),
               "load_before": uptime_before, "load_after": _uptime(),
               "loadavg_1m_before": round(load_before[0], 2), "loadavg_1m_after": round(os.getloadavg()[0], 2)}
    print(json.dumps(summary), flush=True)
    if not args.json_only:
        print()
        print(f"{'case':<32} {'RF1 msg/s':>11} {'RF3 msg/s':>11} {'RF3/RF1':>8} {'RF1 MB/s':>9} {'RF3 MB/s':>9}")
        for what, ratio in ratios.items():
            one, three = by_case[f"RF1 {what}"], by_case[f"RF3 {what}"]
            print(f"{what:<32} {one['msg_per_s']:>11,} {three['msg_per_s']:>11,} {ratio:>8.2f}"
                  f" {one['mb_per_s']:>9.1f} {three['mb_per_s']:>9.1f}")
        print(f"{n:,} messages of {len(MESSAGE)} bytes per case, best of {args.rounds} alternated rounds; "
              f"3 disk nodes on one machine")
        print(f"load average (1/5/15 min) before {uptime_before}, after {_uptime()}; {os.cpu_count()} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
