"""The consumer pool under a burst: it grows by its lag, drains it, shrinks.

A cluster of its own (an embedded ZooKeeper, a local Ray, one raylog
cluster under a temp dir, all stopped by handle at the end), one topic of
``--partitions`` partitions and a pool (``client.consumer_pool``, min 1
member, max the partitions or ``--max-members``) whose handler costs
``--cost-us`` per message: it sleeps that long per message of its batch
(a wait, not CPU: on a 2-core machine sixteen members can each spend it),
then appends ``(partition, offset)`` of every message to a file of its
member (one ``write`` per batch). Phases:

1. the pool starts with one member, idle;
2. a producer sends ``--messages`` messages (``acks=1``) round-robin over
   the partitions, paced evenly over ``--burst-s`` seconds; every
   acknowledgement (partition, offset) is kept;
3. the pool's lag controller adds members while the lag stays above
   ``--target-lag-s`` and the members drain it; **drained** is the first
   sample after the burst where every partition's committed offset is past
   its last acknowledged message;
4. the lag stays low: the controller removes members down to one (or
   ``--shrink-timeout-s`` passes);
5. the pool stops with a drain; the members' files are read back.

A thread samples ``pool.status()`` every ``--sample-s``: members, the
group's lag in seconds (the oldest message not committed) and, per
partition, the committed and end offsets, from which the lag in messages
is counted exactly against the acknowledged offsets.

Reports: members and lag over time (a PNG, with matplotlib, the ``bench``
extra; without it the plot is skipped and said so), peak lag (seconds and
messages), time to drain (from the burst's first message), messages
handled twice (allowed by at-least-once, counted) and lost (acknowledged
but never handled: must be 0), and the ideal drain time for the members
reached (messages x cost / members) with ``drain_s / ideal``.

The table goes to stdout; with ``--json`` the last line is one JSON object
with ``lost``, ``handled_twice``, ``max_members``, ``final_members``,
``peak_lag_s``, ``peak_lag_messages``, ``drain_s``, ``ideal_drain_s``,
``drain_ratio`` (and more). Progress bars on stderr. Exit status 1 when a
message is lost. Usage::

    python bench/pool.py                                    # 200,000 messages in 10 s, 8 partitions, 1 ms each
    python bench/pool.py --messages 2000000 --partitions 16 --cost-us 100 --burst-s 10   # the issue's burst
    python bench/pool.py --messages 2000 --burst-s 1 --partitions 2 --json                 # a quick check
    python bench/pool.py --autoscaling                      # new members bring new Ray nodes

``--autoscaling`` runs on Ray's autoscaler instead of one local Ray: the
local autoscaling cluster of ``raylog bench``
(raylog/tools/configs/bench-autoscale.yaml: a head with no CPU for tasks,
disk nodes of one CPU, up to two compute nodes of two CPUs started when
actors wait for CPUs, removed 12 s after they idle). The topic's
partitions live on one disk node; every member asks for one CPU, so the
members beyond the first wait until the autoscaler has started a node for
them. The samples and the plot then count the cluster's live nodes beside
the members; the report gives the nodes at the start, at most, and at the
end (``nodes_start``, ``max_nodes``, ``final_nodes``).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: --autoscaling: the CPUs the autoscaling config brings for members (one
#: disk node of 1 CPU, two compute nodes of 2): the default --max-members there
AUTOSCALING_MEMBER_CPUS = 5
TOPIC = "burst"
GROUP = "burst-handlers"
#: one handled message in a member's file: partition (u32), offset (u64), big-endian
#: (a format string, not a ``struct.Struct``: the handler is pickled to the members)
RECORD = ">IQ"
RECORD_SIZE = struct.calcsize(RECORD)


def _note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _progress(desc: str, total: int, unit: str = "msg"):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False, file=sys.stderr,
                dynamic_ncols=True, disable=None)


class CostlyHandler:
    """The pool's handler: ``cost_us`` of waiting per message, then the
    batch's ``(partition, offset)`` appended to this member's file under
    ``out_dir`` (made at its first batch, named by process and a random
    id, so a restarted member writes a file of its own)."""

    def __init__(self, out_dir: str, cost_us: float):
        self.out_dir, self.cost_us = out_dir, cost_us
        self._fd = None

    def __call__(self, batch) -> None:
        if self.cost_us:
            time.sleep(self.cost_us * len(batch) / 1e6)
        if self._fd is None:
            path = os.path.join(self.out_dir, f"handled-{os.getpid()}-{uuid.uuid4().hex[:8]}.bin")
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, b"".join(struct.pack(RECORD, m.partition, m.offset) for m in batch))


def read_handled(out_dir: str) -> collections.Counter:
    """``{(partition, offset): times handled}`` over every member's file."""
    counts: collections.Counter = collections.Counter()
    for name in os.listdir(out_dir):
        if not name.startswith("handled-"):
            continue
        with open(os.path.join(out_dir, name), "rb") as f:
            data = f.read()
        whole = len(data) - len(data) % RECORD_SIZE
        counts.update(struct.iter_unpack(RECORD, data[:whole]))
    return counts


def check_handled(acked: dict[int, list[int]], handled: collections.Counter) -> dict:
    """Lost (acknowledged, never handled) and handled twice (every handling past the first)."""
    want = {(p, o) for p, offsets in acked.items() for o in offsets}
    lost = sum(1 for key in want if handled.get(key, 0) == 0)
    twice = sum(n - 1 for n in handled.values() if n > 1)
    unknown = sum(1 for key in handled if key not in want)  # handled, never acknowledged (a failed send)
    return {"lost": lost, "handled_twice": twice, "handled_not_acked": unknown,
            "handled_messages": sum(handled.values())}


class Sampler(threading.Thread):
    """Asks the pool its status every ``every_s``; keeps one row per answer."""

    def __init__(self, pool, every_s: float, t0: float, count_nodes: bool = False):
        super().__init__(name="pool-sampler", daemon=True)
        self.pool, self.every_s, self.t0 = pool, every_s, t0
        self.count_nodes = count_nodes
        self.rows: list[dict] = []
        self.errors = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._halt.is_set():
            asked = time.monotonic()
            try:
                status = self.pool.status()
            except Exception as err:  # noqa: BLE001 - a slow answer on a loaded machine: counted, tried again
                self.errors += 1
                _note(f"status() failed: {type(err).__name__}: {err}")
            else:
                row = {"t": round(time.monotonic() - self.t0, 3), "members": status["member_count"],
                       "running": status["running_count"],
                       "lag_s": status["lag_s"], "processed_per_s": round(status["processed_per_s"] or 0.0),
                       "partitions": {r["partition"]: (r["committed"], r["end"]) for r in status["partitions"]},
                       "events": status["events"]}
                if self.count_nodes:
                    row["nodes"] = live_nodes()
                with self._lock:
                    self.rows.append(row)
            self._halt.wait(max(0.0, self.every_s - (time.monotonic() - asked)))

    def latest(self) -> dict | None:
        with self._lock:
            return self.rows[-1] if self.rows else None

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=120)


def live_nodes() -> int:
    """The Ray cluster's live nodes (the head included)."""
    import ray

    return sum(1 for node in ray.nodes() if node["Alive"])


def lag_messages(row: dict, acked_sorted: dict[int, list[int]]) -> int | None:
    """Acknowledged messages at or past the committed offset and before the end, all partitions."""
    total = 0
    for p, offsets in acked_sorted.items():
        committed, end = row["partitions"].get(p, (None, None))
        if end is None:
            return None
        total += max(0, bisect.bisect_left(offsets, end) - bisect.bisect_left(offsets, committed or 0))
    return total


def drained(row: dict, last_acked: dict[int, int]) -> bool:
    """Every partition committed past its last acknowledged message."""
    for p, last in last_acked.items():
        committed = row["partitions"].get(p, (None, None))[0]
        if committed is None or committed <= last:
            return False
    return True


def burst(client, messages: int, partitions: int, seconds: float, size: int) -> tuple[dict, float]:
    """``messages`` sends paced over ``seconds``; ``{partition: [acknowledged offset, ...]}`` and the send time."""
    value = b"x" * size
    producer = client.producer(acks=1, linger_ms=5)
    futures = []
    t0 = time.monotonic()
    with _progress("burst", messages) as bar:
        sent = 0
        while sent < messages:
            due = min(messages, int((time.monotonic() - t0) / seconds * messages) + 1) if seconds > 0 else messages
            chunk = due - sent
            for i in range(sent, due):
                futures.append(producer.send(TOPIC, value, partition=i % partitions))
            sent = due
            bar.update(chunk)
            if sent < messages:
                time.sleep(0.005)
        producer.flush()
    send_s = time.monotonic() - t0
    producer.close()
    acked: dict[int, list[int]] = {p: [] for p in range(partitions)}
    failed, first_error = 0, None
    for fut in futures:
        try:
            partition, offset = fut.result(timeout_s=60)
        except Exception as err:  # noqa: BLE001 - not acknowledged: not owed to the handler
            failed += 1
            first_error = first_error or f"{type(err).__name__}: {err}"
            continue
        acked[partition].append(offset)
    if failed:
        _note(f"{failed} sends were not acknowledged (not counted as owed); the first: {first_error}")
    return {p: sorted(o) for p, o in acked.items()}, send_s


def plot(rows: list[dict], path: str, burst_end: float, drain_t: float | None) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install raylog[bench]); no plot", file=sys.stderr)
        return None
    t = [r["t"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    top.step(t, [r["members"] for r in rows], where="post", color="tab:blue", label="members")
    top.step(t, [r["running"] for r in rows], where="post", color="tab:cyan", linestyle="--",
             label="members running")
    if rows and "nodes" in rows[0]:
        top.step(t, [r["nodes"] for r in rows], where="post", color="tab:purple", label="Ray nodes")
    top.set_ylabel("members" + (" / Ray nodes" if rows and "nodes" in rows[0] else ""))
    top.set_title("raylog consumer pool under a burst")
    top.grid(True, alpha=0.3)
    bottom.plot(t, [r["lag_s"] if r["lag_s"] is not None else float("nan") for r in rows], color="tab:red")
    bottom.set_ylabel("lag (s, oldest not committed)", color="tab:red")
    bottom.set_xlabel("seconds since the burst's first message")
    bottom.grid(True, alpha=0.3)
    right = bottom.twinx()
    right.plot(t, [r["lag_messages"] if r["lag_messages"] is not None else float("nan") for r in rows],
               color="tab:gray", linestyle="--")
    right.set_ylabel("lag (messages)", color="tab:gray")
    for ax in (top, bottom):
        ax.axvline(burst_end, color="black", linewidth=0.8, linestyle=":", label="burst sent")
        if drain_t is not None:
            ax.axvline(drain_t, color="tab:green", linewidth=0.8, linestyle=":", label="drained")
    top.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _wait(sampler: Sampler, until, timeout_s: float, bar=None, progress=None) -> dict | None:
    """Poll the sampler's rows until ``until(row)`` or the timeout; the row that met it."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        row = sampler.latest()
        if row is not None and row is not seen:
            seen = row
            if bar is not None and progress is not None:
                value = progress(row)
                if value is not None:
                    bar.update(max(0, value - bar.n))
            if until(row):
                return row
        time.sleep(0.1)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=200_000)
    parser.add_argument("--burst-s", type=float, default=10.0, help="the burst's messages paced over this long")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--max-members", type=int, default=None, help="default: the partition count")
    parser.add_argument("--cost-us", type=float, default=1000.0, help="handler time per message (a wait)")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--batch-max", type=int, default=500, help="the pool's batch_max")
    parser.add_argument("--target-lag-s", type=float, default=2.0)
    parser.add_argument("--scale-up-after-s", type=float, default=2.0)
    parser.add_argument("--scale-down-after-s", type=float, default=5.0)
    parser.add_argument("--cooldown-s", type=float, default=3.0)
    parser.add_argument("--scale-step", type=int, default=1)
    parser.add_argument("--sample-s", type=float, default=1.0, help="how often status() is sampled")
    parser.add_argument("--drain-timeout-s", type=float, default=900.0)
    parser.add_argument("--shrink-timeout-s", type=float, default=300.0)
    parser.add_argument("--out", default="bench/results/pool", help="path prefix of the .png and -samples.jsonl")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (data, Ray logs, handled files)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--node-timeout-s", type=float, default=300.0,
                        help="--autoscaling: how long the cluster and its disk node may take to start")
    parser.add_argument("--autoscaling", action="store_true",
                        help="run on the local autoscaling cluster: members ask for a CPU each, nodes come and go")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.partitions < 1 or args.cost_us < 0 or args.burst_s < 0:
        parser.error("--messages and --partitions must be at least 1, --cost-us and --burst-s not negative")
    max_members = min(args.partitions, args.max_members or args.partitions)
    if args.autoscaling and args.max_members is None:
        # the CPUs the autoscaling config can bring for members: one disk node's and two compute nodes'
        max_members = min(max_members, AUTOSCALING_MEMBER_CPUS)

    from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL
    from raylog.client import Client
    from raylog.zk.server import EmbeddedZooKeeper

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix="rlpool-", dir="/tmp")
    handled_dir = os.path.join(work, "handled")
    os.makedirs(handled_dir)
    zookeeper = None if args.autoscaling else EmbeddedZooKeeper(data_dir=os.path.join(work, "zk"))
    cluster = None
    client = pool = sampler = None
    failed = True
    nodes_start = None
    try:
        if args.autoscaling:
            from raylog.tools.bench.cluster import LocalCluster

            _note("starting the local autoscaling cluster (its head, ZooKeeper and the supervisor)")
            cluster = LocalCluster(timeout_s=args.node_timeout_s, cluster="poolbench")
            cluster.start()
            import ray  # after the start: Ray reads its auth mode (token, as the head runs) at import
            from ray.autoscaler.sdk import request_resources

            ray.init(address=cluster.ray_address, logging_level="WARNING", log_to_driver=False)
            # the topic's disk node, kept for the run (a request replaces the last one: only this one is made)
            request_resources(bundles=[{DISK_RESOURCE: 1}])
            _note("waiting for the disk node")
            deadline = time.monotonic() + args.node_timeout_s
            while not any(n["Alive"] and n["Resources"].get(DISK_RESOURCE) for n in ray.nodes()):
                if time.monotonic() > deadline:
                    raise SystemExit(f"no disk node came up within {args.node_timeout_s} s; "
                                     f"the autoscaler's log (monitor.*) is under {cluster.state_dir}")
                time.sleep(1.0)
            nodes_start = live_nodes()
            client = Client(zookeeper=cluster.zookeeper, cluster="poolbench", data_dir=cluster.data_dir)
        else:
            _note(f"starting ZooKeeper and Ray under {work}")
            zookeeper.start()
            import ray

            # members wait rather than compute: a logical CPU each, beyond the two the machine has
            ray.init(address="local", num_cpus=max_members + 4, resources={DISK_RESOURCE: 1},
                     labels={NODE_LABEL: "local"}, include_dashboard=False, logging_level="WARNING",
                     _temp_dir=os.path.join(work, "ray"))
            client = Client(zookeeper=zookeeper.connect_string, cluster="poolbench",
                            data_dir=os.path.join(work, "data"), data_host="127.0.0.1")
        client.create_topic(TOPIC, partitions=args.partitions)

        _note("starting the pool (one member)")
        pool = client.consumer_pool(
            TOPIC, GROUP, CostlyHandler(handled_dir, args.cost_us), min_members=1, max_members=max_members,
            target_lag_s=args.target_lag_s, batch_max=args.batch_max, scale_up_after_s=args.scale_up_after_s,
            scale_down_after_s=args.scale_down_after_s, cooldown_s=args.cooldown_s, scale_step=args.scale_step,
            sample_interval_s=min(1.0, args.sample_s), commit_interval_s=1.0)

        t0, wall0 = time.monotonic(), time.time()
        sampler = Sampler(pool, args.sample_s, t0, count_nodes=args.autoscaling)
        sampler.start()
        _note(f"burst: {args.messages:,} messages over {args.burst_s} s on {args.partitions} partitions")
        acked, send_s = burst(client, args.messages, args.partitions, args.burst_s, args.size)
        burst_end = time.monotonic() - t0
        acked_total = sum(map(len, acked.values()))
        last_acked = {p: o[-1] for p, o in acked.items() if o}

        _note("draining")
        with _progress("drain", acked_total) as bar:
            row = _wait(sampler, lambda r: r["t"] >= burst_end and drained(r, last_acked), args.drain_timeout_s,
                        bar, lambda r: acked_total - (lag_messages(r, acked) or 0))
        drain_t = row["t"] if row is not None else None
        if drain_t is None:
            _note(f"not drained within {args.drain_timeout_s} s")

        _note("shrinking")
        reached = max((r["members"] for r in sampler.rows), default=1)
        with _progress("shrink", max(0, reached - 1), unit="member") as bar:
            row = _wait(sampler, lambda r: r["members"] <= 1, args.shrink_timeout_s if drain_t is not None else 0,
                        bar, lambda r: reached - r["members"])
        shrink_t = row["t"] if row is not None else None
        sampler.stop()
        rows = sampler.rows
        events = rows[-1]["events"] if rows else []

        _note("stopping the pool (drain)")
        pool.stop(drain=True)
        nodes_after, nodes_gone_s = None, None
        if args.autoscaling:
            _note("waiting for the autoscaler to remove the idle nodes")
            stopped = time.monotonic()
            while time.monotonic() - stopped < args.node_timeout_s:
                nodes_after = live_nodes()
                if nodes_after <= nodes_start:
                    nodes_gone_s = round(time.monotonic() - stopped, 1)
                    break
                time.sleep(1.0)
        handled = read_handled(handled_dir)
        result = check_handled(acked, handled)

        for r in rows:
            r["lag_messages"] = lag_messages(r, acked)
        members_reached = max((r["members"] for r in rows), default=1)
        peak_s = max((r["lag_s"] for r in rows if r["lag_s"] is not None), default=None)
        peak_m = max((r["lag_messages"] for r in rows if r["lag_messages"] is not None), default=None)
        ideal = acked_total * args.cost_us / 1e6 / members_reached
        report = {
            **result,
            "messages": args.messages,
            "acknowledged": acked_total,
            "partitions": args.partitions,
            "cost_us": args.cost_us,
            "burst_s": round(burst_end, 3),
            "send_s": round(send_s, 3),
            "max_members_allowed": max_members,
            "max_members": members_reached,
            "final_members": rows[-1]["members"] if rows else None,
            "peak_lag_s": None if peak_s is None else round(peak_s, 3),
            "peak_lag_messages": peak_m,
            "drain_s": drain_t,
            "ideal_drain_s": round(ideal, 3),
            "drain_ratio": None if drain_t is None or ideal <= 0 else round(drain_t / ideal, 3),
            "shrink_s": None if shrink_t is None or drain_t is None else round(shrink_t - drain_t, 3),
            "member_seconds": round(sum(a["members"] * (b["t"] - a["t"]) for a, b in zip(rows, rows[1:])
                                        if drain_t is None or a["t"] < drain_t), 1),
            # the handlers' work over the member-seconds until the drain: how busy the members were
            "busy_fraction": None,
            "samples": len(rows),
            "status_errors": sampler.errors,
            "scale_events": [{"t": round(e["at"] - wall0, 1), "from": e["from"],
                              "to": e["to"], "why": e["why"]} for e in events],
            "autoscaling": args.autoscaling,
            "nodes_start": nodes_start,
            "max_nodes": max((r["nodes"] for r in rows if "nodes" in r), default=None),
            "nodes_after_stop": nodes_after,
            "nodes_removed_after_s": nodes_gone_s,
            "loadavg_before": round(load_before[0], 2),
            "loadavg_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
            "work_dir": work,
        }
        if report["member_seconds"]:
            report["busy_fraction"] = round(acked_total * args.cost_us / 1e6 / report["member_seconds"], 3)
        samples_path = args.out + "-samples.jsonl"
        with open(samples_path, "w") as f:
            for r in rows:
                f.write(json.dumps({k: v for k, v in r.items() if k not in ("events", "partitions")}) + "\n")
        report["samples_file"] = samples_path
        report["plot"] = plot(rows, args.out + ".png", burst_end, drain_t)

        print(f"{'members over time':<26} " + " ".join(
            f"{r['t']:.0f}s:{r['members']}" for i, r in enumerate(rows)
            if i == 0 or r["members"] != rows[i - 1]["members"]))
        print(f"{'members running':<26} " + " ".join(
            f"{r['t']:.0f}s:{r['running']}" for i, r in enumerate(rows)
            if i == 0 or r["running"] != rows[i - 1]["running"]))
        if args.autoscaling:
            print(f"{'Ray nodes over time':<26} " + " ".join(
                f"{r['t']:.0f}s:{r['nodes']}" for i, r in enumerate(rows)
                if i == 0 or r.get("nodes") != rows[i - 1].get("nodes")))
            print(f"{'Ray nodes':<26} {nodes_start} at the start, max {report['max_nodes']}, "
                  f"{nodes_after} after the pool stopped"
                  + (f" ({nodes_gone_s} s later)" if nodes_gone_s is not None else " (not removed in time)"))
        print(f"{'burst':<26} {acked_total:,} acknowledged in {send_s:.1f} s on {args.partitions} partitions, "
              f"handler {args.cost_us:g} us/message")
        print(f"{'members':<26} max {members_reached} (allowed {max_members}), final {report['final_members']}")
        print(f"{'peak lag':<26} {report['peak_lag_s']} s, {peak_m:,} messages" if peak_m is not None
              else f"{'peak lag':<26} {report['peak_lag_s']} s")
        print(f"{'time to drain':<26} {drain_t} s from the first message (ideal for {members_reached} members: "
              f"{ideal:.1f} s; ratio {report['drain_ratio']})")
        print(f"{'members busy':<26} {report['busy_fraction']} of {report['member_seconds']} member-seconds "
              f"until the drain")
        print(f"{'time to shrink to 1':<26} {report['shrink_s']} s after the drain")
        print(f"{'handled twice / lost':<26} {result['handled_twice']:,} / {result['lost']:,}")
        print(f"{'plot':<26} {report['plot'] or 'skipped (no matplotlib)'}; samples {samples_path}")
        print(f"load average (1 min) before {report['loadavg_before']}, after {report['loadavg_after']}; "
              f"{report['cpus']} cpus")
        if args.json:
            print(json.dumps(report), flush=True)
        failed = False
        return 1 if result["lost"] else 0
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        if pool is not None:
            try:
                pool.close()
            except Exception as err:  # noqa: BLE001 - the rest is stopped either way
                print(f"stopping the pool failed: {err}", file=sys.stderr)
        if client is not None:
            try:
                client.close()
            except Exception as err:  # noqa: BLE001
                print(f"closing the client failed: {err}", file=sys.stderr)
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
        if zookeeper is not None:
            zookeeper.stop()
        if cluster is not None:
            cluster.failed = failed
            cluster.stop()
        if args.keep or failed:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
