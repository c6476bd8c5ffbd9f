"""Transactions benchmark: consume -> transform -> produce, exactly once
against at least once, in the same run.

A cluster of its own (an embedded ZooKeeper, a local Ray, one raylog
cluster under a temp dir, all stopped by handle at the end). ``--messages``
messages of ``--size`` bytes are written to an input topic of
``--partitions`` partitions first; then each pipeline reads all of them as
a consumer group of its own, transforms each message (its value upper-cased,
under its key) and produces the result to an output topic, committing every
``--commit-ms`` (100 ms, Kafka Streams' ``commit.interval.ms`` under
exactly once):

* ``exactly_once``: a consumer with ``isolation_level="read_committed"``
  and a transactional producer (``transactional_id``): at each commit,
  ``send_offsets_to_transaction`` with the consumed positions, then
  ``commit_transaction``, then ``begin_transaction`` for the next interval;
* ``at_least_once``: a consumer (read_uncommitted) and an idempotent
  producer (``acks="all"``): at each commit, ``flush`` (every output
  stored), then the consumer's ``commit()``.

The pipelines are a plain loop of one consumer and one producer in this
process, not ``client.consumer_pool(..., exactly_once=True)``: the loop
measures what the transaction protocol costs (the coordinator's calls, the
markers, the read_committed reads) against the same loop without it, with
nothing else in between; the pool commits one transaction per polled
batch of a partition, whose size the poll decides, not a clock.

Measured per run: messages per second from the first poll to the last
commit, the commits made, and each commit's latency (p50, p99: the
transaction's end, or the flush and the offset commit). Runs alternate
(at least once, exactly once, ...) over ``--runs`` rounds, so that the
machine's load falls on both alike; the summary gives the medians and
``ratio`` = exactly once / at least once messages per second (the
acceptance asks for at least 0.5). After each exactly-once run the group's
committed offsets are checked to be the input's ends and the output topic,
read ``read_committed``, to hold one output per input message.

Output: a short table; with ``--json``, first one JSON line per run and
one for the summary (``ratio``, ``outputs_ok``, the medians). Exit status 1
when an exactly-once run's outputs or offsets are wrong. Usage::

    python bench/transactions.py [--messages 500000] [--partitions 4] [--size 100] [--commit-ms 100] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

INPUT = "txn-in"
EXACTLY_ONCE, AT_LEAST_ONCE = "exactly_once", "at_least_once"


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fill(client, messages: int, partitions: int, size: int) -> None:
    """``messages`` keyed messages of ``size`` bytes, round-robin over the partitions."""
    producer = client.producer(acks=1, batch_size=500, linger_ms=5)
    pad = b"x" * max(0, size - 12)
    try:
        for i in range(messages):
            producer.send(INPUT, b"%011d " % i + pad, key=b"k%d" % (i % 1000), partition=i % partitions)
        producer.flush()
    finally:
        producer.close()


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def pipeline(client, mode: str, output: str, group: str, messages: int, commit_s: float,
             timeout_s: float) -> dict:
    """Read every input message as ``group``, transform, produce to
    ``output``, commit every ``commit_s`` (see the module docstring)."""
    eos = mode == EXACTLY_ONCE
    consumer = client.consumer(INPUT, group=group, auto_offset_reset="earliest", enable_auto_commit=False,
                               isolation_level="read_committed" if eos else "read_uncommitted")
    if eos:
        producer = client.producer(transactional_id=f"bench-{group}", batch_size=500, linger_ms=5)
    else:
        producer = client.producer(acks="all", batch_size=500, linger_ms=5)
    commit_ms: list[float] = []
    positions: dict = {}
    done = 0
    try:
        if eos:
            producer.begin_transaction()
        started = None
        last_commit = time.monotonic()
        deadline = time.monotonic() + timeout_s
        while done < messages:
            if time.monotonic() > deadline:
                raise SystemExit(f"{mode}: {done} of {messages} messages after {timeout_s} s")
            batch = consumer.poll(timeout_ms=50, max_messages=5000)
            if started is None and batch:
                started = time.monotonic()
            for m in batch:
                producer.send(output, m.value.upper(), m.key)
                positions[(m.topic, m.partition)] = m.next_offset
            done += len(batch)
            now = time.monotonic()
            if now - last_commit >= commit_s or done >= messages:
                t = time.monotonic()
                if eos:
                    producer.send_offsets_to_transaction(positions, group)
                    producer.commit_transaction()
                    if done < messages:
                        producer.begin_transaction()
                else:
                    producer.flush()
                    consumer.commit()
                commit_ms.append((time.monotonic() - t) * 1000.0)
                last_commit = time.monotonic()
        took = time.monotonic() - started
    finally:
        producer.close()
        consumer.close()
    return {"mode": mode, "messages": done, "seconds": round(took, 3), "msg_per_s": round(done / took, 1),
            "commits": len(commit_ms), "commit_p50_ms": round(_percentile(commit_ms, 0.5), 2),
            "commit_p99_ms": round(_percentile(commit_ms, 0.99), 2)}


def check_exactly_once(client, output: str, group: str, messages: int) -> dict:
    """The group's committed offsets are the input's ends, and the output
    read ``read_committed`` holds ``messages`` records."""
    ends = client.end_offsets(INPUT)
    committed = {row["partition"]: row["committed"] for row in client.describe_group(group)
                 if row.get("topic") == INPUT and "partition" in row}
    consumer = client.consumer(output, auto_offset_reset="earliest", isolation_level="read_committed")
    out_ends = client.end_offsets(output)
    count = 0
    try:
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            count += len(consumer.poll(timeout_ms=200, max_messages=50_000))
            if all((consumer.position(output, p) or 0) >= e for p, e in out_ends.items()):
                break
    finally:
        consumer.close()
    offsets_ok = committed == ends
    return {"outputs_read_committed": count, "outputs_ok": count == messages and offsets_ok,
            "offsets_at_ends": offsets_ok}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--commit-ms", type=float, default=100.0, help="the commit interval of both pipelines")
    parser.add_argument("--runs", type=int, default=3, help="rounds of (at least once, exactly once)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="the longest one pipeline run may take")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (data, Ray logs)")
    parser.add_argument("--json", action="store_true", help="JSON lines (each run, then the summary) before the table")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.partitions < 1 or args.runs < 1 or args.commit_ms <= 0:
        parser.error("--messages, --partitions and --runs must be at least 1, --commit-ms positive")

    from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL
    from raylog.client import Client
    from raylog.zk.server import EmbeddedZooKeeper

    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix="rltxn-", dir="/tmp")
    zookeeper = EmbeddedZooKeeper(data_dir=os.path.join(work, "zk"))
    client = None
    failed = True
    rows: list[dict] = []
    try:
        _note(f"starting ZooKeeper and Ray under {work}")
        zookeeper.start()
        import ray

        ray.init(address="local", num_cpus=4, resources={DISK_RESOURCE: 1}, labels={NODE_LABEL: "local"},
                 include_dashboard=False, logging_level="WARNING", _temp_dir=os.path.join(work, "ray"))
        client = Client(zookeeper=zookeeper.connect_string, cluster="txnbench", data_dir=os.path.join(work, "data"),
                        data_host="127.0.0.1")
        client.create_topic(INPUT, partitions=args.partitions)
        _note(f"writing {args.messages:,} input messages of {args.size} bytes on {args.partitions} partitions")
        fill(client, args.messages, args.partitions, args.size)
        for run in range(args.runs):
            for mode in (AT_LEAST_ONCE, EXACTLY_ONCE):
                output, group = f"txn-out-{mode}-{run}", f"txn-{mode}-{run}"
                client.create_topic(output, partitions=args.partitions)
                _note(f"run {run + 1}/{args.runs}: {mode}")
                row = pipeline(client, mode, output, group, args.messages, args.commit_ms / 1000.0, args.timeout_s)
                row["run"] = run
                if mode == EXACTLY_ONCE:
                    row.update(check_exactly_once(client, output, group, args.messages))
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
                client.delete_topic(output)

        def median(mode: str, key: str):
            values = [r[key] for r in rows if r["mode"] == mode and r[key] is not None]
            return round(statistics.median(values), 2) if values else None

        summary = {"summary": True, "messages": args.messages, "partitions": args.partitions, "size": args.size,
                   "commit_ms": args.commit_ms, "runs": args.runs}
        for mode in (AT_LEAST_ONCE, EXACTLY_ONCE):
            for key in ("msg_per_s", "commit_p50_ms", "commit_p99_ms", "commits"):
                summary[f"{mode}_{key}"] = median(mode, key)
        summary["ratio"] = round(summary[f"{EXACTLY_ONCE}_msg_per_s"] / summary[f"{AT_LEAST_ONCE}_msg_per_s"], 3)
        summary["outputs_ok"] = all(r.get("outputs_ok", True) for r in rows)
        summary["loadavg_before"] = round(load_before[0], 2)
        summary["loadavg_after"] = round(os.getloadavg()[0], 2)
        summary["cpus"] = os.cpu_count()
        if args.json:
            print(json.dumps(summary), flush=True)
        print()
        print(f"{'pipeline (median of ' + str(args.runs) + ' runs)':<34}{'msg/s':>12}{'commits':>10}"
              f"{'commit p50 ms':>15}{'commit p99 ms':>15}")
        for mode in (AT_LEAST_ONCE, EXACTLY_ONCE):
            print(f"{mode.replace('_', ' '):<34}{summary[mode + '_msg_per_s']:>12,.0f}"
                  f"{summary[mode + '_commits']:>10.0f}{summary[mode + '_commit_p50_ms']:>15}"
                  f"{summary[mode + '_commit_p99_ms']:>15}")
        print(f"{'exactly once / at least once':<34}{summary['ratio']:>12} (the acceptance asks >= 0.5)")
        print(f"{'outputs read_committed once each':<34}{summary['outputs_ok']!s:>12}")
        print(f"load average (1 min) before {summary['loadavg_before']}, after {summary['loadavg_after']}; "
              f"{summary['cpus']} cpus")
        failed = False
        return 0 if summary["outputs_ok"] else 1
    finally:
        if client is not None:
            try:
                from raylog.actors.transaction_coordinator import stop_transaction_coordinator

                stop_transaction_coordinator("txnbench")
            except Exception as err:  # noqa: BLE001 - the rest is stopped either way
                print(f"stopping the transaction coordinator failed: {err}", file=sys.stderr)
            try:
                client.close()
            except Exception as err:  # noqa: BLE001
                print(f"closing the client failed: {err}", file=sys.stderr)
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
        zookeeper.stop()
        if args.keep or failed:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
