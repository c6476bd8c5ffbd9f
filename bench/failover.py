"""Failover time of a replicated partition: how long acks="all" producing
stops when the leader replica's process is killed.

A local multi-node cluster (``ray.cluster_utils.Cluster``, three disk nodes,
see ``bench/disk_cluster.py``), a one-partition topic of replication factor 3
(``min_insync_replicas`` 2), and a producer with ``acks="all"`` sending at a
steady rate from a thread of its own. Then, ``--kills`` times, one at a time:
the process of the replica that leads now (by the partition's ``state`` node)
is SIGKILLed, and measured are

* ``to_leader_s``: from the kill to a leader visible in ZooKeeper again (the
  partition's endpoint node registered anew, under a new epoch: the killed
  replica restarted by Ray, or a follower that took over);
* ``to_first_ack_s``: from the kill to the first acknowledgement of a send
  made after the kill.

Before the next kill the ISR must be whole again (all three replicas) and the
producer acknowledged again.

``--mode process`` (the default) kills the leader's process alone; ``--mode
node`` removes the leader's Ray node as well (its process killed with it, as
a lost machine; the node is added back after the first acknowledgement and
its replica rejoins before the next kill). Either way the data port of the
dead leader refuses connections, so a follower of the ISR takes over at once
(:mod:`raylog.replication.liveness`), without waiting for the dead
session to expire; the killed replica, restarted by Ray, follows. The times
are set against 2 s (process) and ``session_timeout + 5 s`` (node).

``--hosts`` runs on the hosts kit instead (:mod:`raylog.testing.hosts`: a
head host with ZooKeeper and the Ray head, three disk hosts, each a network
namespace with its own address and disk; the producer on the client
machine): ``--cuts`` times, the leader's host is **cut off** (its link down,
its processes alive) until a send made after the cut is acknowledged, then
healed, and the ISR must be whole again before the next cut; then
``--kills`` times the leader's **process** is killed. The bound of a cut is
``session_timeout + 5 s`` (the leader's ZooKeeper session must expire before
a follower may take over), that of a killed process 2 s.

Prints one JSON line per kill (or cut), a summary line (median and max), then a
table. Usage::

    python bench/failover.py [--kills 10] [--rate 200] [--mode process|node] [--json-only]
    python bench/failover.py --hosts [--cuts 10] [--kills 5]      # as root
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from disk_cluster import disk_cluster, node_kwargs  # noqa: E402 - bench/disk_cluster.py, beside this file

TOPIC = "failover"
#: at most this long for one kill's leader, first acknowledgement and whole ISR
WAIT_S = 180.0


class SteadyProducer:
    """Sends one message every ``1/rate`` seconds; records, per send, when it
    was made and when (and whether) it was acknowledged."""

    def __init__(self, client, rate: float):
        from raylog.retry import RetryPolicy

        self.producer = client.producer(acks="all", linger_ms=1, retry=RetryPolicy(
            max_tries=10_000, delay_s=0.05, max_delay_s=0.5, deadline_s=WAIT_S))
        self.rate = rate
        self.sends: list[list] = []  # [sent_t, acked_t or None, ok or None]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def start(self) -> "SteadyProducer":
        self._thread.start()
        return self

    def _run(self) -> None:
        i, started = 0, time.monotonic()
        while not self._stop.is_set():
            row = [time.monotonic(), None, None]
            with self._lock:
                self.sends.append(row)
            future = self.producer.send(TOPIC, b"m%09d" % i)
            future.add_done_callback(lambda f, row=row: self._acked(row, f))
            i += 1
            self._stop.wait(max(0.0, started + i / self.rate - time.monotonic()))

    def _acked(self, row, future) -> None:
        row[1], row[2] = time.monotonic(), future.exception(0) is None

    def first_ack_after(self, t: float) -> float | None:
        """When the first send made after ``t`` was acknowledged (None: not yet)."""
        with self._lock:
            rows = [r for r in self.sends if r[0] > t and r[2]]
        return min((r[1] for r in rows), default=None)

    def stop(self) -> dict:
        from raylog.errors import RaylogError

        self._stop.set()
        self._thread.join(5)
        errors = []
        for finish in (self.producer.flush, self.producer.close):
            try:  # a failed send is reported again here; it is counted below
                finish()
            except RaylogError as err:
                errors.append(f"{type(err).__name__}: {err}"[:300])
        with self._lock:
            return {"sent": len(self.sends), "acked": sum(1 for r in self.sends if r[2]),
                    "failed": sum(1 for r in self.sends if r[2] is False), "errors": errors[:1]}


def wait_for(check, timeout_s: float = WAIT_S, interval_s: float = 0.005):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval_s)
    return None


def one_kill(client, steady: SteadyProducer, i: int, ray_cluster=None, nodes=None) -> dict:
    """Kill the leader's process (with ``ray_cluster`` and ``nodes``: remove its
    node too, and add it back once a follower leads)."""
    import ray

    from raylog.replication.admin import leader_actor
    from raylog.replication.state import read_state

    zk, registry, cluster = client._zk, client.registry, client.settings.cluster
    state, actor = leader_actor(zk, registry, cluster, TOPIC, 0)
    pid = ray.get(actor.pid.remote(), timeout=30)
    before = registry.endpoint(TOPIC, 0)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    if ray_cluster is not None:
        # after the kill: a lost machine's processes stop at once, and removing
        # a node takes a while, during which its worker could go on serving
        ray_cluster.remove_node(nodes[state.leader], allow_graceful=False)

    def registered():
        now = registry.endpoint(TOPIC, 0)
        return now is not None and now.get("epoch") != (before or {}).get("epoch") and time.monotonic()

    leader_at = wait_for(registered)
    acked_at = wait_for(lambda: steady.first_ack_after(killed), interval_s=0.01)
    after = read_state(zk, registry.paths, TOPIC, 0)[0]
    if ray_cluster is not None:
        nodes[state.leader] = ray_cluster.add_node(**node_kwargs(state.leader))
    whole_at = wait_for(lambda: len(read_state(zk, registry.paths, TOPIC, 0)[0].isr) == len(after.replicas)
                        and time.monotonic(), interval_s=0.05)
    return {
        "bench": "failover", "kill": i, "pid": pid, "old_leader": state.leader, "new_leader": after.leader,
        "leader_epoch": after.leader_epoch, "took_over": after.leader != state.leader,
        "to_leader_s": None if leader_at is None else round(leader_at - killed, 3),
        "to_first_ack_s": None if acked_at is None else round(acked_at - killed, 3),
        "isr_whole_s": None if whole_at is None else round(whole_at - killed, 3),
        "mode": "process" if ray_cluster is None else "node",
    }


def summarize(rows: list[dict], session_s: float, bound_s: float) -> dict:
    """Median and max of the times, each set against ``bound_s``."""
    out = {"bench": "failover", "case": "summary", "mode": rows[0]["mode"] if rows else None, "events": len(rows),
           "session_timeout_s": session_s, "bound_s": bound_s}
    for key in ("to_leader_s", "to_first_ack_s"):
        values = [r[key] for r in rows if r[key] is not None]
        out[key] = {"median": round(statistics.median(values), 3) if values else None,
                    "max": max(values) if values else None, "missing": len(rows) - len(values)}
        out[key]["within_bound"] = bool(values) and len(values) == len(rows) and max(values) <= bound_s
    out["took_over"] = sum(1 for r in rows if r["took_over"])
    return out


def print_table(rows: list[dict], summary: dict) -> None:
    def cell(v):
        return f"{v:>10.3f}" if isinstance(v, (int, float)) else f"{'—':>10}"

    what = "cut" if rows and "cut" in rows[0] else "kill"
    print()
    print(f"{summary['mode']}: {what} of the leader's {'host' if what == 'cut' else 'process'}")
    print(f"{what:>4} {'old leader':>10} {'new leader':>10} {'epoch':>5} {'leader s':>10} {'first ack s':>11}"
          f" {'ISR whole s':>11}")
    for r in rows:
        print(f"{r[what]:>4} {r['old_leader']:>10} {r['new_leader']:>10} {r['leader_epoch']:>5}"
              f" {cell(r['to_leader_s'])} {cell(r['to_first_ack_s']):>11} {cell(r['isr_whole_s']):>11}")
    bound = summary["bound_s"]
    for key, label in (("to_leader_s", f"{what} -> leader in ZooKeeper"), ("to_first_ack_s", f"{what} -> first ack")):
        s = summary[key]
        print(f"{label:<30} median {cell(s['median'])} s  max {cell(s['max'])} s  "
              f"bound {bound:g} s: {'within' if s['within_bound'] else 'NOT within'}")
    print(f"a follower took over in {summary['took_over']} of {summary['events']}; load average "
          f"{os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus")


#: the ZooKeeper session timeout of the partition actors (kazoo's default)
ACTOR_SESSION_S = 10.0
#: the bound on a killed leader process's replacement
PROCESS_BOUND_S = 2.0


def _cut(hosts, host) -> None:
    """Cut ``host`` off: its link down, its processes alive."""
    from raylog.testing import faults

    faults.cut_host(host)


def _heal(hosts, host) -> bool:
    """Heal the cut; True when Ray had given the host's node up meanwhile and
    it was started again."""
    import ray

    from raylog.testing import faults

    faults.heal(hosts)
    if any(n["Alive"] and n["NodeManagerAddress"] == host.address for n in ray.nodes()):
        return False
    hosts.restart_ray(host)
    return True


def one_cut(hosts, client, steady: SteadyProducer, i: int) -> dict:
    """Cut the leader's host off until a send made after the cut is
    acknowledged, heal it, wait for the ISR to be whole again."""
    from raylog.replication.state import read_state

    zk, registry = client._zk, client.registry
    state = read_state(zk, registry.paths, TOPIC, 0)[0]
    host = hosts.host(state.leader)
    before = registry.endpoint(TOPIC, 0)
    _cut(hosts, host)
    cut_at = time.monotonic()  # once the link is down: a send before it may still be answered
    try:
        def registered():
            now = registry.endpoint(TOPIC, 0)
            return now is not None and now.get("epoch") != (before or {}).get("epoch") and time.monotonic()

        leader_at = wait_for(registered)
        acked_at = wait_for(lambda: steady.first_ack_after(cut_at), interval_s=0.01)
        after = read_state(zk, registry.paths, TOPIC, 0)[0]
    finally:
        restarted = _heal(hosts, host)
    healed_at = time.monotonic()

    def whole():
        return len(read_state(zk, registry.paths, TOPIC, 0)[0].isr) == len(after.replicas) and time.monotonic()

    whole_at = wait_for(whole, interval_s=0.05)
    return {
        "bench": "failover", "mode": "hosts-cut", "cut": i, "old_leader": state.leader, "new_leader": after.leader,
        "leader_epoch": after.leader_epoch, "took_over": after.leader != state.leader,
        "to_leader_s": None if leader_at is None else round(leader_at - cut_at, 3),
        "to_first_ack_s": None if acked_at is None else round(acked_at - cut_at, 3),
        "isr_whole_s": None if whole_at is None else round(whole_at - healed_at, 3),
        "ray_node_restarted": restarted,
    }


def run_hosts(args) -> int:
    from tqdm import tqdm

    from raylog.testing.hosts import HostsCluster, unavailable

    why = unavailable()
    if why is not None:
        print(f"bench/failover.py --hosts: {why}", file=sys.stderr)
        return 2
    with HostsCluster(hosts=4) as hosts:
        client = hosts.client(cluster="bench-failover")
        client.create_topic(TOPIC, partitions=1, replication_factor=3, min_insync_replicas=2,
                            replica_lag_ms=args.replica_lag_ms, flush_ms=5)
        steady = SteadyProducer(client, args.rate).start()
        cuts, kills = [], []
        try:
            if wait_for(lambda: steady.first_ack_after(0.0), timeout_s=120) is None:
                raise RuntimeError("the producer got no acknowledgement within 120 s")
            for i in tqdm(range(args.cuts), desc="cut", unit="cut", file=sys.stderr):
                time.sleep(1.0)
                row = one_cut(hosts, client, steady, i)
                cuts.append(row)
                print(json.dumps(row, sort_keys=True), flush=True)
            for i in tqdm(range(args.kills), desc="kill", unit="kill", file=sys.stderr):
                time.sleep(1.0)
                row = one_kill(client, steady, i)
                row["mode"] = "hosts-process"
                kills.append(row)
                print(json.dumps(row, sort_keys=True), flush=True)
        finally:
            totals = steady.stop()
    summaries = []
    for rows, bound in ((cuts, ACTOR_SESSION_S + 5.0), (kills, PROCESS_BOUND_S)):
        if not rows:
            continue
        summary = summarize(rows, ACTOR_SESSION_S, bound)
        summary["producer"] = totals
        summaries.append((rows, summary))
        print(json.dumps(summary, sort_keys=True), flush=True)
    if not args.json_only:
        for rows, summary in summaries:
            print_table(rows, summary)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=None, help="leader process kills (default 10; 5 with --hosts)")
    p.add_argument("--hosts", action="store_true", help="on the hosts kit (root): cut the leader's host, then kill")
    p.add_argument("--cuts", type=int, default=10, help="with --hosts: cuts of the leader's host")
    p.add_argument("--rate", type=float, default=200.0, help="messages a second of the acks=all producer")
    p.add_argument("--replica-lag-ms", type=int, default=3000)
    p.add_argument("--mode", choices=("process", "node"), default="process",
                   help="kill the leader's process (Ray restarts it), or remove its node as well")
    p.add_argument("--json-only", action="store_true")
    args = p.parse_args(argv)
    if args.kills is None:
        args.kills = 5 if args.hosts else 10
    if args.hosts:
        return run_hosts(args)
    from tqdm import tqdm

    with disk_cluster(3, name="bench-failover") as (cluster, nodes, client):
        client.create_topic(TOPIC, partitions=1, replication_factor=3, min_insync_replicas=2,
                            replica_lag_ms=args.replica_lag_ms, flush_ms=5)
        session_s = client._zk._session_timeout / 1000.0  # partition actors connect with the same default
        steady = SteadyProducer(client, args.rate).start()
        rows = []
        try:
            if wait_for(lambda: steady.first_ack_after(0.0), timeout_s=60) is None:
                raise RuntimeError("the producer got no acknowledgement within 60 s")
            for i in tqdm(range(args.kills), desc="failover", unit="kill", file=sys.stderr):
                time.sleep(1.0)  # steady producing before each kill
                row = one_kill(client, steady, i, *((cluster, nodes) if args.mode == "node" else ()))
                rows.append(row)
                print(json.dumps(row, sort_keys=True), flush=True)
        finally:
            totals = steady.stop()
    bound_s = PROCESS_BOUND_S if args.mode == "process" else session_s + 5.0
    summary = summarize(rows, session_s, bound_s)
    summary["producer"] = totals
    print(json.dumps(summary, sort_keys=True), flush=True)
    if not args.json_only:
        print_table(rows, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
