"""Consumer-group rebalance on a real ZooKeeper: storms, joins and leaves.

Measured on one embedded ZooKeeper this script starts and stops itself, with
every member on its own session (as consumers are), watched by a separate
observer session that reads the owner nodes
(``consumers/<group>/owners/<topic>/<p>``) on every change, so what is
reported is what ZooKeeper held, not what the members believed.

* ``storm``: 32 members start at once over a 64-partition topic. Reported:
  the time until the owner nodes equal the range assignment of the 32, the
  rebalance steps each member ran (min / median / max), and each member's
  ZooKeeper reads per rebalance step. Run twice in the same invocation: with
  the default settle period, and without one (``settle 0``, the baseline: a
  rebalance on every change).
* ``join`` / ``leave``: one member joins (leaves) a settled group of 32, and one of
  8 (where ranges shift the most). Reported:
  the time to convergence, the partitions that move, ``max_unowned`` (the
  most partitions seen without an owner at once) and ``unowned_not_moved``
  (partitions that do not move but were seen unowned: the cooperative
  rebalance keeps this at 0, so ``max_unowned`` is at most ``moved``), and the
  ZooKeeper reads per member for the change.

Output: one JSON line per measurement, then a table. Usage::

    python bench/rebalance.py [--members 32] [--partitions 64] [--session-timeout 6] [--json-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from raylog.config import TopicConfig  # noqa: E402
from raylog.groups.assignment import range_assignment  # noqa: E402
from raylog.groups.member import SETTLE_S, GroupMember  # noqa: E402
from raylog.zk.paths import Paths  # noqa: E402

TOPIC = "bench"
WAIT_S = 180.0


class OwnerWatch:
    """Watches one group's owner nodes of one topic from its own session."""

    def __init__(self, zk, cluster: str, group: str, partitions: int):
        self.zk, self.paths, self.group, self.partitions = zk, Paths(cluster), group, partitions
        self._cond = threading.Condition()
        self._target: dict[int, str] | None = None
        self._converged_at: float | None = None
        self._unowned_seen: set[int] = set()
        self._max_unowned = 0
        zk.ensure_path(self.paths.owners(group, TOPIC))
        zk.ChildrenWatch(self.paths.owners(group, TOPIC), self._changed)

    def owners(self) -> dict[int, str]:
        names = self.zk.get_children(self.paths.owners(self.group, TOPIC))
        reads = [(int(n), self.zk.get_async(self.paths.owner(self.group, TOPIC, int(n)))) for n in names]
        out = {}
        for p, result in reads:
            try:
                out[p] = result.get(timeout=10)[0].decode()
            except Exception:  # noqa: BLE001 - deleted meanwhile
                pass
        return out

    def _changed(self, children):
        now = time.perf_counter()
        present = {int(n) for n in children}
        owners = self.owners() if len(present) == self.partitions else None
        with self._cond:
            if self._target is None:
                return
            unowned = set(range(self.partitions)) - present
            self._unowned_seen |= unowned
            self._max_unowned = max(self._max_unowned, len(unowned))
            if self._converged_at is None and owners == self._target:
                self._converged_at = now
                self._cond.notify_all()

    def expect(self, member_ids) -> None:
        assignment = range_assignment({TOPIC: self.partitions}, {m: [TOPIC] for m in member_ids})
        with self._cond:
            self._target = {p: m for m, tps in assignment.items() for _, p in tps}
            self._converged_at, self._unowned_seen, self._max_unowned = None, set(), 0

    def wait(self) -> tuple[float, int, set[int]]:
        self._changed(self.zk.get_children(self.paths.owners(self.group, TOPIC)))
        deadline = time.monotonic() + WAIT_S
        with self._cond:
            while self._converged_at is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"the owner nodes did not converge within {WAIT_S:g}s")
                self._cond.wait(remaining)
            result = (self._converged_at, self._max_unowned, set(self._unowned_seen))
            self._target = None
            return result


def moved(before: list[str], after: list[str], partitions: int) -> set[int]:
    a = range_assignment({TOPIC: partitions}, {m: [TOPIC] for m in before})
    b = range_assignment({TOPIC: partitions}, {m: [TOPIC] for m in after})
    owner_a = {p: m for m, tps in a.items() for _, p in tps}
    owner_b = {p: m for m, tps in b.items() for _, p in tps}
    return {p for p in range(partitions) if owner_a.get(p) != owner_b.get(p)}


class Bench:
    def __init__(self, connect, cluster: str, partitions: int):
        self.connect, self.cluster, self.partitions = connect, cluster, partitions
        self.clients = []

    def member(self, group: str, name: str, settle_s: float) -> GroupMember:
        client = self.connect()
        self.clients.append(client)
        return GroupMember(client, self.cluster, group, [TOPIC], consumer_id=name, settle_s=settle_s)

    def close(self):
        for client in self.clients:
            client.stop()
            client.close()

    def storm(self, count: int, settle_s: float) -> tuple[dict, list[GroupMember], OwnerWatch]:
        group = f"storm-{uuid.uuid4().hex[:6]}"
        observer = self.connect()
        self.clients.append(observer)
        watch = OwnerWatch(observer, self.cluster, group, self.partitions)
        names = [f"m{i:03d}" for i in range(count)]
        members = [self.member(group, n, settle_s) for n in names]
        watch.expect(names)
        started = time.perf_counter()
        threads = [threading.Thread(target=m.start, kwargs={"timeout_s": 1}) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        converged, max_unowned, _ = watch.wait()
        time.sleep(max(1.0, 3 * settle_s))  # let late events run their course before counting
        steps = [m.rebalances for m in members]
        reads_per_step = [m.zk_reads / max(1, m.rebalances) for m in members]
        return {
            "scenario": "storm", "members": count, "partitions": self.partitions, "settle_s": settle_s,
            "converge_s": round(converged - started, 3),
            "rebalances_per_member_min": min(steps), "rebalances_per_member_median": statistics.median(steps),
            "rebalances_per_member_max": max(steps),
            "zk_reads_per_rebalance_per_member_median": round(statistics.median(reads_per_step), 1),
            "zk_reads_per_rebalance_per_member_max": round(max(reads_per_step), 1),
            "zk_reads_bound_members_plus_2p": count + 2 * self.partitions + 4,
        }, members, watch

    def change(self, kind: str, members: list[GroupMember], watch: OwnerWatch, settle_s: float):
        before = [m.consumer_id for m in members]
        if kind == "join":
            newcomer = self.member(watch.group, f"m{len(members):03d}", settle_s)
            after = before + [newcomer.consumer_id]
        else:
            leaver = members[-1]
            after = before[:-1]
        reads_before = {m.consumer_id: m.zk_reads for m in members}
        watch.expect(after)
        started = time.perf_counter()
        if kind == "join":
            newcomer.start(timeout_s=1)
            members = members + [newcomer]
        else:
            leaver.close()
            members = members[:-1]
        converged, max_unowned, unowned_seen = watch.wait()
        time.sleep(max(1.0, 3 * settle_s))
        must_move = moved(before, after, self.partitions)
        existing = [m for m in members if m.consumer_id in reads_before]
        reads = [m.zk_reads - reads_before[m.consumer_id] for m in existing]
        return {
            "scenario": kind, "members_before": len(before), "members_after": len(after),
            "partitions": self.partitions, "converge_s": round(converged - started, 3),
            "moved": len(must_move), "max_unowned": max_unowned,
            "unowned_not_moved": len(unowned_seen - must_move),
            "zk_reads_per_member_median": statistics.median(reads), "zk_reads_per_member_max": max(reads),
        }, members


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=32)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--session-timeout", type=float, default=6.0)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)

    from raylog.zk.registry import Registry
    from raylog.zk.server import EmbeddedZooKeeper
    from raylog.zk.session import connect_kazoo

    server = EmbeddedZooKeeper()
    server.start()
    results = []
    try:
        cluster = f"bench-{uuid.uuid4().hex[:8]}"
        admin = connect_kazoo(server.connect_string, timeout=args.session_timeout)
        Registry(admin, cluster).create_topic(TOPIC, TopicConfig(partitions=args.partitions))
        bench = Bench(lambda: connect_kazoo(server.connect_string, timeout=args.session_timeout),
                      cluster, args.partitions)
        try:
            # the storm of --members with and without a settle period, then a
            # join and a leave in a small group, where ranges shift the most
            for count, settle in ((args.members, SETTLE_S), (args.members, 0.0), (8, SETTLE_S)):
                result, members, watch = bench.storm(count, settle)
                results.append(result)
                print(json.dumps(result), flush=True)
                if settle == SETTLE_S:  # changes in a settled group
                    for kind in ("join", "leave"):
                        result, members = bench.change(kind, members, watch, settle)
                        results.append(result)
                        print(json.dumps(result), flush=True)
                for m in members:
                    m.close(timeout_s=5)
        finally:
            bench.close()
            admin.stop()
            admin.close()
    finally:
        server.stop()

    if not args.json_only:
        print()
        print(f"{'scenario':<8} {'members':>8} {'settle s':>8} {'converge s':>10} {'rebal/member':>14} "
              f"{'reads/rebal':>11} {'moved':>5} {'max unowned':>11} {'unowned∖moved':>13}")
        for r in results:
            if r["scenario"] == "storm":
                print(f"{'storm':<8} {r['members']:>8} {r['settle_s']:>8} {r['converge_s']:>10} "
                      f"{r['rebalances_per_member_min']}/{r['rebalances_per_member_median']}/"
                      f"{r['rebalances_per_member_max']:<6} {r['zk_reads_per_rebalance_per_member_median']:>11} "
                      f"{'':>5} {'':>11} {'':>13}")
            else:
                print(f"{r['scenario']:<8} {str(r['members_before']) + '->' + str(r['members_after']):>8} "
                      f"{'':>8} {r['converge_s']:>10} {'':>14} {r['zk_reads_per_member_median']:>11} "
                      f"{r['moved']:>5} {r['max_unowned']:>11} {r['unowned_not_moved']:>13}")
        print("rebal/member is min/median/max rebalance steps per member; reads/rebal the median ZooKeeper "
              "reads of a member per step (storm) or per member for the change (join, leave)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
