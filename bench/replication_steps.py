"""One RF 3 ``acks="all"`` commit, split into its steps, measured in the real
cluster (three disk nodes, ``bench/disk_cluster.py``).

A producer sends N 200-byte messages (batch 50, as bench/replication.py)
to a topic of replication factor 3; every process of the cluster records
when each step of each PRODUCE round happened (``bench/commit_steps``,
timestamps of one clock for the whole machine), and the rounds are split:

a. the producer's send -> the leader has appended the set;
b. -> the leader reads its log for a follower (the follower's long poll wakes);
c. -> the follower has the answer (sent, received, parsed);
d. the follower appends; e. the follower flushes (fsync);
f. -> the leader learns the follower's flushed end (its next request);
g. the last follower learnt (or the leader's own flush, in parallel) -> the
   producer has the acknowledgement.

Prints the median, mean and 90th percentile of each step over the rounds
(each round one commit). Usage::

    python bench/replication_steps.py [-n 40000]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TOPIC = "rf3-acksall"
STEPS = {
    "b": "b. leader appended -> leader reads for the follower",
    "c": "c. leader's read -> follower has the answer",
    "d": "d. follower appends",
    "e": "e. follower flushes (fsync)",
    "f": "f. follower flushed -> leader learns it",
}


def _first(rows, kind, pred, after=0):
    for t, k, a in rows:
        if k == kind and t >= after and pred(a):
            return t
    return None


def split(directory: str, start: int) -> dict[str, list[float]]:
    """The steps (ms) of every round recorded in ``directory`` after ``start``."""
    procs = {path: [(int(f[0]), f[1], f[2:]) for f in (line.split() for line in open(path)) if len(f) > 1]
             for path in glob.glob(os.path.join(directory, "*.ev"))}
    rounds, leader, followers = [], None, []
    for path, rows in procs.items():
        for t, kind, a in rows:
            if kind == "round" and a[0] == TOPIC and int(a[1]) >= start:
                rounds.append((int(a[1]), int(a[3]), t))
            elif kind == "app" and TOPIC in a[0]:
                leader = path
            elif kind == "rapp" and TOPIC in a[0] and path not in followers:
                followers.append(path)
    steps: dict[str, list[float]] = {}

    def add(name, ns):
        steps.setdefault(name, []).append(ns / 1e6)

    lead = procs[leader]
    for t_send, end, t_ack in sorted(rounds)[3:-3]:  # (not the first rounds nor the last)
        t_app = _first(lead, "app", lambda a: TOPIC in a[0] and int(a[2]) >= end, t_send)
        t_flushed = _first(lead, "flush", lambda a: TOPIC in a[0] and int(a[1]) >= end, t_send)
        if t_app is None:
            continue
        add("a. producer send -> leader appended", t_app - t_send)
        add("   (leader appended -> its own flush, in parallel)", (t_flushed or t_app) - t_app)
        learnt = []
        for path in followers:
            rows = procs[path]
            served = [t for t, k, a in lead if k == "serve" and TOPIC in a[0] and int(a[3]) >= end and t >= t_app]
            t_recv = _first(rows, "rrecv", lambda a: TOPIC in a[0] and int(a[2]) >= end, t_app)
            t_rapp = _first(rows, "rapp", lambda a: TOPIC in a[0] and int(a[2]) >= end, t_app)
            t_rflushed = _first(rows, "flush", lambda a: TOPIC in a[0] and int(a[1]) >= end, t_app)
            if None in (t_recv, t_rapp, t_rflushed) or not served:
                continue
            add(STEPS["b"], served[0] - t_app)
            add(STEPS["c"], t_recv - served[0])
            add(STEPS["d"], t_rapp - t_recv)
            add(STEPS["e"], t_rflushed - t_rapp)
            t_learn = [t for t, k, a in lead if k == "learn" and int(a[2]) >= end and t >= t_rflushed]
            if t_learn:
                add(STEPS["f"], t_learn[0] - t_rflushed)
                learnt.append(t_learn[0])
        if followers and len(learnt) == len(followers):
            add("g. last follower learnt (or leader's flush) -> producer has the ack",
                t_ack - max(learnt + [t_flushed or 0]))
        add("= producer send -> ack (one commit)", t_ack - t_send)
    return steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--messages", type=int, default=40_000)
    p.add_argument("--keep-events", action="store_true", help="keep the event files (else removed)")
    args = p.parse_args(argv)
    probes = os.path.join(HERE, "commit_steps")
    events = tempfile.mkdtemp(prefix="rlsteps-", dir="/tmp")
    # every process the cluster starts from here on records (the driver: installed below)
    os.environ["RAYLOG_PROBE_DIR"] = events
    os.environ["PYTHONPATH"] = os.pathsep.join([probes] + [x for x in [os.environ.get("PYTHONPATH")] if x])
    sys.path.insert(0, probes)
    import sitecustomize  # noqa: F401 - the driver's probes (this process started before the variable was set)

    from disk_cluster import disk_cluster  # beside this file
    from replication import bench_produce

    with disk_cluster(3, name="bench-steps") as (_cluster, _nodes, client):
        client.create_topic(TOPIC, partitions=1, replication_factor=3, min_insync_replicas=2)
        bench_produce(client, TOPIC, 1000, "all", 3)  # warm-up: connections, caches
        time.sleep(1)
        start = time.monotonic_ns()
        row = bench_produce(client, TOPIC, args.messages, "all", 3)
    steps = split(events, start)
    if not args.keep_events:
        shutil.rmtree(events, ignore_errors=True)
    commits = len(steps.get("= producer send -> ack (one commit)", []))
    kept = f"; events in {events}" if args.keep_events else ""
    print(f"{commits} commits; {row['msg_per_s']:,} msg/s; load average {os.getloadavg()[0]:.2f}{kept}")
    for name in sorted(steps):
        v = sorted(steps[name])
        print(f"{name:<72} median {statistics.median(v):6.2f} ms  mean {statistics.mean(v):6.2f}"
              f"  p90 {v[int(len(v) * 0.9)]:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
