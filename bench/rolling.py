"""A rolling restart under load: does any producer or consumer notice?

A topic of replication factor 3 (``min_insync_replicas`` 2) over three disk
nodes, an ``acks="all"`` producer sending numbered values at a steady rate
from a thread of its own, and a consumer group member reading them. After a
quiet stretch (the "before" latencies), every disk node is restarted in turn
with :meth:`raylog.Client.rolling_restart`: drained (its leads handed off,
its followers out of the ISR), restarted, and waited for until its replicas
are all in sync again. Then the leads are balanced back to the preferred
replicas (:meth:`raylog.Client.balance_leaders`).

What a restart is: on the local cluster (``ray.cluster_utils.Cluster``,
``bench/disk_cluster.py``) the node's Ray node is removed and added back on
the same disk; with ``--hosts`` (the hosts kit, :mod:`raylog.testing.hosts`,
as root) every process of the disk host is stopped (SIGTERM, then SIGKILL
after a grace) and its Ray node started again.

Reported: sends failed (target 0), messages lost and duplicated (the whole
topic read back at the end, and what the consumer group saw), p50/p99/max
send latency before and during the roll, the longest time a partition had
no leader (from the old leader refusing to the new one's endpoint, per
handoff), and the leaders per node before, after the roll and after the
balance. The table goes to stdout; with ``--json`` the last line is one JSON
object. Usage::

    python bench/rolling.py [--partitions 3] [--rate 100] [--json]
    python bench/rolling.py --hosts [--json]          # as root
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from raylog.retry import RetryPolicy  # noqa: E402
from raylog.testing.on_hosts import read_values  # noqa: E402

TOPIC = "rolling"


class Load:
    """The producer (``acks="all"``) and the consumer group member, each on a
    thread of its own."""

    def __init__(self, client, topic: str, rate: float):
        self.client, self.topic, self.rate = client, topic, rate
        self.producer = client.producer(acks="all", retry=RetryPolicy(max_tries=8, delay_s=0.05, max_delay_s=1.0,
                                                                      deadline_s=30))
        self.sends: list[tuple[float, float]] = []  # (sent at, latency s)
        self.acked: list[bytes] = []
        self.failed: list[str] = []
        self.consumed: list[bytes] = []
        self.stop = threading.Event()
        self.stop_consumer = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]
        for t in self._threads:
            t.start()

    def _produce(self):
        i, period = 0, 1.0 / self.rate
        next_at = time.monotonic()
        while not self.stop.is_set():
            value = b"m%08d" % i
            started = time.time()
            try:
                self.producer.send(self.topic, value, key=value).result(60)
                self.acked.append(value)
            except Exception as err:  # noqa: BLE001 - counted
                self.failed.append(repr(err))
            self.sends.append((started, time.time() - started))
            i += 1
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))

    def _consume(self):
        consumer = self.client.consumer([self.topic], group="rolling-bench", auto_offset_reset="earliest")
        try:
            while not self.stop_consumer.is_set():
                self.consumed += [m.value for m in consumer.poll(timeout_ms=500)]
        finally:
            consumer.close()

    def finish(self, timeout_s: float = 120.0):
        self.stop.set()
        self._threads[0].join(90)
        self.producer.close()
        deadline = time.monotonic() + timeout_s
        while set(self.acked) - set(self.consumed) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2.0)  # a surplus shows
        self.stop_consumer.set()
        self._threads[1].join(30)


def latencies_ms(sends, start: float, end: float) -> dict:
    window = sorted(lat * 1000 for at, lat in sends if start <= at < end)
    if not window:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": len(window), "p50": round(statistics.median(window), 1),
            "p99": round(window[min(len(window) - 1, int(len(window) * 0.99))], 1), "max": round(window[-1], 1)}


def leader_counts(client, topic: str) -> dict:
    counts = collections.Counter()
    for row in client.describe_topic(topic)["partitions"]:
        counts[row.get("leader")] += 1
        for n in row.get("replicas") or ():
            counts.setdefault(n, 0)
    return dict(sorted(counts.items()))


def run(client, restart, nodes, args) -> dict:
    client.create_topic(TOPIC, partitions=args.partitions, replication_factor=3, min_insync_replicas=2, flush_ms=5)
    deadline = time.monotonic() + 180
    while any(set(r["isr"]) != set(r["replicas"]) for r in client.describe_topic(TOPIC)["partitions"]):
        assert time.monotonic() < deadline, "the replicas did not get in sync"
        time.sleep(0.5)
    leaders_before = leader_counts(client, TOPIC)
    load = Load(client, TOPIC, args.rate)
    time.sleep(args.quiet_s)
    roll_start = time.time()

    def step(node, what, detail):
        print(f"{time.time() - roll_start:7.1f} s  {node}: {what}", file=sys.stderr, flush=True)

    rows = client.rolling_restart(nodes, restart=restart, timeout_s=300, on_step=step)
    roll_end = time.time()
    time.sleep(args.quiet_s)
    leaders_after_roll = leader_counts(client, TOPIC)
    balanced = client.balance_leaders([TOPIC], timeout_s=30)
    leaders_after_balance = leader_counts(client, TOPIC)
    load.finish()
    stored = read_values(client, TOPIC, len(load.acked), timeout_s=120.0)
    seen = collections.Counter(stored)
    acked = set(load.acked)
    before = latencies_ms(load.sends, 0, roll_start)
    during = latencies_ms(load.sends, roll_start, roll_end)
    leaderless = [r["longest_leaderless_s"] for r in rows if r["longest_leaderless_s"] is not None]
    return {
        "bench": "rolling", "where": "hosts" if args.hosts else "local", "partitions": args.partitions,
        "rate": args.rate, "sends": len(load.sends), "acked": len(load.acked),
        "sends_failed": len(load.failed), "failures": load.failed[:3],
        "lost": len(acked - set(seen)), "duplicated": sum(c - 1 for c in seen.values() if c > 1),
        "group_lost": len(acked - set(load.consumed)),
        "group_redelivered": len(load.consumed) - len(set(load.consumed)),
        "longest_leaderless_s": round(max(leaderless), 3) if leaderless else None,
        "p50_send_ms_before": before["p50"], "p99_send_ms_before": before["p99"], "max_send_ms_before": before["max"],
        "p50_send_ms_during": during["p50"], "p99_send_ms_during": during["p99"], "max_send_ms_during": during["max"],
        "roll_s": round(roll_end - roll_start, 1), "nodes": rows,
        "leaders_before": leaders_before, "leaders_after_roll": leaders_after_roll,
        "leaders_after_balance": leaders_after_balance, "balance_moved": len(balanced["moved"]),
    }


def table(result: dict) -> str:
    lines = [f"rolling restart of {len(result['nodes'])} disk nodes ({result['where']}), {result['partitions']} "
             f"partitions RF 3, acks=all at {result['rate']:g}/s: {result['sends']} sends, the roll {result['roll_s']} s",
             "",
             f"{'node':<10}{'leads moved':>12}{'leaderless s':>14}{'restart s':>11}{'in sync after s':>17}"]
    for r in result["nodes"]:
        leaderless = "-" if r["longest_leaderless_s"] is None else f"{r['longest_leaderless_s']:.3f}"
        lines.append(f"{r['node']:<10}{r['leaders_moved']:>12}{leaderless:>14}"
                     f"{r['restart_s']:>11}{r['whole_after_s']:>17}")
    lines += ["",
              f"sends failed {result['sends_failed']}, lost {result['lost']}, duplicated {result['duplicated']} "
              f"(consumer group: {result['group_lost']} not seen, {result['group_redelivered']} seen twice)",
              f"send latency ms   before: p50 {result['p50_send_ms_before']} p99 {result['p99_send_ms_before']} "
              f"max {result['max_send_ms_before']}",
              f"                  during: p50 {result['p50_send_ms_during']} p99 {result['p99_send_ms_during']} "
              f"max {result['max_send_ms_during']}",
              f"longest leaderless: {result['longest_leaderless_s']} s",
              f"leaders per node  before {result['leaders_before']}  after the roll {result['leaders_after_roll']}  "
              f"after balancing {result['leaders_after_balance']}"]
    return "\n".join(lines)


def run_local(args) -> dict:
    from disk_cluster import disk_cluster, node_kwargs

    with disk_cluster(3, name="bench-rolling") as (cluster, nodes, client):
        def restart(label):
            cluster.remove_node(nodes[label], allow_graceful=True)
            nodes[label] = cluster.add_node(**node_kwargs(label))
            cluster.wait_for_nodes()

        return run(client, restart, sorted(nodes), args)


def run_hosts(args) -> dict:
    from raylog.testing.hosts import HostsCluster, unavailable
    from raylog.testing.on_hosts import bring_back

    why = unavailable()
    if why:
        raise SystemExit(f"bench/rolling.py --hosts: {why}")
    with HostsCluster(hosts=4) as hosts:
        client = hosts.client(cluster="bench-rolling")

        def restart(name):
            host = hosts.host(name)
            host.stop_processes(grace_s=5.0)
            bring_back(hosts, host)

        return run(client, restart, [h.name for h in hosts.disk_hosts], args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", action="store_true", help="on the hosts kit (root)")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--rate", type=float, default=100.0, help="messages a second of the acks=all producer")
    p.add_argument("--quiet-s", type=float, default=10.0, help="load before the roll (and after it)")
    p.add_argument("--json", action="store_true", help="the last line: one JSON object")
    args = p.parse_args(argv)
    result = run_hosts(args) if args.hosts else run_local(args)
    print(table(result))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0 if result["sends_failed"] == 0 and result["lost"] == 0 and result["duplicated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
