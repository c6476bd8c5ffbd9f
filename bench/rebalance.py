"""Consumer-group rebalance: how long until every partition has its new owner.

For groups of 2, 4 and 8 members over one 16-partition topic, on a real
embedded ZooKeeper this script starts and stops itself, it measures the time
from a membership change to the moment the owner nodes
(``consumers/<group>/owners/<topic>/<p>``) match the range assignment of the
new membership, i.e. every partition is owned again by exactly one live
member, the one the paper's algorithm gives it. The owner nodes are watched
by a separate observer session (a ``ChildrenWatch`` that re-reads every owner
node on each change), so the clock stops on what ZooKeeper holds, not on what
the members believe.

Changes measured, each the median of several repetitions:

* ``join``: a group of N-1 members, one more member starts (the clock starts
  before ``GroupMember.start``);
* ``leave``: a group of N members, one member closes cleanly (``close()``);
* ``crash``: a group of N members, one of which runs in a child process that
  is killed with SIGKILL: nothing tells ZooKeeper, so its nodes stay until
  its session expires, and the rest rebalance after that.

Each result is compared with twice the session timeout (the acceptance
point: 8 members over 16 partitions converge in under 2 x the session
timeout, including after a crash, which cannot be detected faster than one
session timeout). ``max_unowned`` is the most partitions seen without an
owner at once during the change (the paper's rebalance releases everything
before claiming).

Output: one JSON line per measurement, then a table. Usage::

    python bench/rebalance.py [--session-timeout 4] [--repetitions 5] [--crash-repetitions 3] [--json-only]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kazoo.exceptions import NoNodeError  # noqa: E402

from raylog.config import TopicConfig  # noqa: E402
from raylog.groups.assignment import range_assignment  # noqa: E402
from raylog.groups.member import GroupMember  # noqa: E402
from raylog.groups.paths import Paths  # noqa: E402

PARTITIONS = 16
GROUP_SIZES = (2, 4, 8)
TOPIC = "bench"
GROUP = "bench-group"
WAIT_S = 120.0


# --------------------------------------------------------------------------
# the observer


class OwnerWatch:
    """Watches the owner nodes of one group and topic; reports when they
    equal a target ``{partition: consumer id}``."""

    def __init__(self, zk, cluster: str, group: str, topic: str, partitions: int):
        self.zk = zk
        self.paths = Paths(cluster)
        self.group, self.topic, self.partitions = group, topic, partitions
        self._cond = threading.Condition()
        self._target: dict[int, str] | None = None
        self._converged_at: float | None = None
        self._max_unowned = 0
        zk.ensure_path(self.paths.owners(group, topic))
        zk.ChildrenWatch(self.paths.owners(group, topic), self._changed)

    def snapshot(self) -> dict[int, str]:
        names = self.zk.get_children(self.paths.owners(self.group, self.topic))
        reads = [(int(n), self.zk.get_async(self.paths.owner(self.group, self.topic, int(n)))) for n in names]
        owners = {}
        for p, result in reads:
            try:
                data, _ = result.get(timeout=10)
            except NoNodeError:
                continue
            owners[p] = data.decode()
        return owners

    def _changed(self, children):
        owners = self.snapshot()
        now = time.perf_counter()
        self._record(owners, now)

    def _record(self, owners: dict[int, str], now: float) -> None:
        with self._cond:
            if self._target is None:
                return
            self._max_unowned = max(self._max_unowned, self.partitions - len(owners))
            if self._converged_at is None and owners == self._target:
                self._converged_at = now
                self._cond.notify_all()

    def expect(self, member_ids) -> None:
        """Arm for a change: from now on, wait for the assignment of ``member_ids``."""
        assignment = range_assignment({self.topic: self.partitions}, {m: [self.topic] for m in member_ids})
        with self._cond:
            self._target = {p: m for m, tps in assignment.items() for _, p in tps}
            self._converged_at = None
            self._max_unowned = 0

    def wait(self, timeout_s: float = WAIT_S) -> tuple[float, int]:
        """``(perf_counter time of convergence, max unowned)``."""
        self._record(self.snapshot(), time.perf_counter())  # already there?
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._converged_at is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"the owner nodes did not reach {self._target} within {timeout_s:g}s")
                self._cond.wait(remaining)
            converged, unowned = self._converged_at, self._max_unowned
            self._target = None
            return converged, unowned


# --------------------------------------------------------------------------
# the crashing member (a child process)


def child_main(args) -> None:
    from raylog.groups.zookeeper import connect_kazoo

    # Die with the parent: it holds our stdin open.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    zk = connect_kazoo(args.zk, timeout=args.session_timeout)
    member = GroupMember(zk, args.cluster, GROUP, [TOPIC])
    member.start(timeout_s=WAIT_S)
    print(f"READY {member.consumer_id}", flush=True)
    while True:
        time.sleep(3600)


def spawn_child(connect_string: str, cluster: str, session_timeout: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", "--zk", connect_string,
         "--cluster", cluster, "--session-timeout", str(session_timeout)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    line = _read_line(proc, WAIT_S)
    if not line.startswith("READY "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the member child process did not start (said {line!r})")
    return proc, line.split()[1]


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return box[0].strip() if box else ""


def _stop_child(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass


# --------------------------------------------------------------------------
# the runs


class Bench:
    def __init__(self, server, session_timeout: float):
        from raylog.groups.registry import Registry
        from raylog.groups.zookeeper import connect_kazoo

        self.server = server
        self.session_timeout = session_timeout
        self.connect = lambda: connect_kazoo(server.connect_string, timeout=session_timeout)
        self.clients = []
        self.admin = self._client()

        self.cluster = f"bench-{uuid.uuid4().hex[:8]}"
        Registry(self.admin, self.cluster).create_topic(TOPIC, TopicConfig(partitions=PARTITIONS))
        self.watch = OwnerWatch(self.admin, self.cluster, GROUP, TOPIC, PARTITIONS)

    def _client(self):
        client = self.connect()
        self.clients.append(client)
        return client

    def new_member(self) -> GroupMember:
        return GroupMember(self._client(), self.cluster, GROUP, [TOPIC])

    def settle(self, members: list[GroupMember], extra_ids=()) -> None:
        self.watch.expect([m.consumer_id for m in members] + list(extra_ids))
        self.watch.wait()

    def close(self):
        for client in self.clients:
            try:
                client.stop()
                client.close()
            except Exception:  # noqa: BLE001 - best effort
                pass

    def join_and_leave(self, size: int, repetitions: int) -> tuple[list, list, int, int]:
        steady = [self.new_member() for _ in range(size - 1)]
        for m in steady:
            m.start(timeout_s=WAIT_S)
        self.settle(steady)
        joins, leaves, unowned_join, unowned_leave = [], [], 0, 0
        try:
            for _ in range(repetitions):
                newcomer = self.new_member()
                self.watch.expect([m.consumer_id for m in steady] + [newcomer.consumer_id])
                t0 = time.perf_counter()
                newcomer.start(timeout_s=WAIT_S)
                done, unowned = self.watch.wait()
                joins.append(done - t0)
                unowned_join = max(unowned_join, unowned)

                self.watch.expect([m.consumer_id for m in steady])
                t0 = time.perf_counter()
                newcomer.close()
                done, unowned = self.watch.wait()
                leaves.append(done - t0)
                unowned_leave = max(unowned_leave, unowned)
        finally:
            for m in steady:
                m.close()
        return joins, leaves, unowned_join, unowned_leave

    def crash(self, size: int, repetitions: int) -> tuple[list, int]:
        steady = [self.new_member() for _ in range(size - 1)]
        for m in steady:
            m.start(timeout_s=WAIT_S)
        self.settle(steady)
        samples, unowned_max = [], 0
        try:
            for _ in range(repetitions):
                proc, child_id = spawn_child(self.server.connect_string, self.cluster, self.session_timeout)
                try:
                    self.settle(steady, [child_id])
                    self.watch.expect([m.consumer_id for m in steady])
                    t0 = time.perf_counter()
                    os.kill(proc.pid, signal.SIGKILL)
                    done, unowned = self.watch.wait()
                    samples.append(done - t0)
                    unowned_max = max(unowned_max, unowned)
                finally:
                    _stop_child(proc)
        finally:
            for m in steady:
                m.close()
        return samples, unowned_max


def summarize(size: int, change: str, samples: list[float], unowned: int, session_timeout: float) -> dict:
    limit = 2 * session_timeout
    median = statistics.median(samples)
    return {
        "bench": "rebalance",
        "members": size,
        "partitions": PARTITIONS,
        "change": change,
        "repetitions": len(samples),
        "median_s": round(median, 4),
        "min_s": round(min(samples), 4),
        "max_s": round(max(samples), 4),
        "max_unowned": unowned,
        "session_timeout_s": session_timeout,
        "limit_s": limit,
        "median_vs_limit": round(median / limit, 4),
        "within_limit": max(samples) < limit,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--session-timeout", type=float, default=4.0, help="ZooKeeper session timeout of every member, seconds")
    parser.add_argument("--repetitions", type=int, default=5, help="join/leave repetitions per group size")
    parser.add_argument("--crash-repetitions", type=int, default=3, help="crash repetitions per group size (0: skip)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(GROUP_SIZES))
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--zk", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args)
        return 0

    import logging

    logging.basicConfig(level=logging.ERROR)
    from raylog.groups.zookeeper import EmbeddedZooKeeper

    rows = []
    server = EmbeddedZooKeeper(log_level="WARN")
    bench = None
    try:
        server.start()
        bench = Bench(server, args.session_timeout)
        for size in args.sizes:
            joins, leaves, uj, ul = bench.join_and_leave(size, args.repetitions)
            for change, samples, unowned in (("join", joins, uj), ("leave", leaves, ul)):
                rows.append(summarize(size, change, samples, unowned, args.session_timeout))
                print(json.dumps(rows[-1]), flush=True)
            if args.crash_repetitions > 0:
                samples, unowned = bench.crash(size, args.crash_repetitions)
                rows.append(summarize(size, "crash", samples, unowned, args.session_timeout))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if bench is not None:
            bench.close()
        server.stop()

    eight = [r for r in rows if r["members"] == 8]
    verdict = {
        "bench": "rebalance",
        "acceptance": "8 members x 16 partitions converge in under 2 x session timeout",
        "session_timeout_s": args.session_timeout,
        "pass": bool(eight) and all(r["within_limit"] for r in eight),
    }
    print(json.dumps(verdict), flush=True)
    if not args.json_only:
        print()
        print(f"rebalance over {PARTITIONS} partitions, session timeout {args.session_timeout:g} s "
              f"(limit 2 x = {2 * args.session_timeout:g} s)")
        print(f"{'members':>7}  {'change':<6}  {'median s':>9}  {'min s':>7}  {'max s':>7}  {'max unowned':>11}  {'of limit':>8}")
        for r in rows:
            print(f"{r['members']:>7}  {r['change']:<6}  {r['median_s']:>9.3f}  {r['min_s']:>7.3f}  "
                  f"{r['max_s']:>7.3f}  {r['max_unowned']:>11}  {r['median_vs_limit']:>7.1%}")
        print(f"acceptance ({verdict['acceptance']}): {'PASS' if verdict['pass'] else 'FAIL'}")
    return 0 if verdict["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
