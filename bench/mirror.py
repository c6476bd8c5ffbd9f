"""Mirroring between two clusters: throughput, lag, and exactly-once.

Two raylog clusters in one process tree: a source and a target, each with a
ZooKeeper of its own, sharing one local Ray (the mirror needs only the
source's ZooKeeper and token). Phases:

1. ``--prefill`` messages go into the source topic (``--partitions``);
2. a plain consume of the source reads them all (msg/s: the baseline);
3. a mirror starts (``--members`` actors) and copies them (msg/s, from its
   start to the last message in the target, actor start-up included);
4. a producer sends at ``--rate`` msg/s for ``--duration`` s while the
   mirror runs; a consumer of the target measures each message's lag
   (arrival in the target minus its create time at the source);
5. both topics are read back whole: per partition, the target must hold the
   source's values in the same order (lost, duplicated and out-of-order
   counts).

The table goes to stdout; with ``--json`` the last line is one JSON object
with ``lost``, ``duplicated``, ``reordered``, ``msg_per_s``,
``copy_msg_per_s`` (from the first copied set to the end: actor start-up
left out; progress read from the mirror's records), ``plain_msg_per_s``,
``lag_p50_s``, ``lag_p99_s``, and ``stored_ratio`` (the target's log length
over the source's: 1.0 when every set went on as the source stores it, with
``--compression`` too). Usage::

    python bench/mirror.py [--prefill 50000] [--rate 2000] [--duration 20] [--partitions 4]
                           [--compression zstd] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TOPIC = "events"


def _note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _read_all(client, topic: str, partitions: int, timeout_s: float = 300.0) -> dict[int, list[bytes]]:
    ends = client.end_offsets(topic)
    out = {p: [] for p in range(partitions)}
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        deadline = time.monotonic() + timeout_s
        while any((consumer.position(topic, p) or 0) < ends[p] for p in range(partitions)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end in {timeout_s} s")
            for m in consumer.poll(timeout_ms=300):
                out[m.partition].append(m.value)
    finally:
        consumer.close()
    return out


def _compare(want: dict, got: dict) -> dict:
    lost = duplicated = reordered = 0
    for p, values in want.items():
        have = got.get(p, [])
        seen = set(have)
        lost += sum(1 for v in values if v not in seen)
        duplicated += len(have) - len(seen)
        if not lost and not duplicated and have != values:
            reordered += 1
    return {"lost": lost, "duplicated": duplicated, "reordered": reordered}


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=2000.0, help="messages per second in phase 4")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--compression", choices=["gzip", "lz4", "zstd"], default=None,
                        help="the source producers' codec (the mirror forwards compressed sets as they are)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import ray

    from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL
    from raylog.client import Client
    from raylog.mirror import progress as mirror_progress, spec as mirror_spec
    from raylog.zk.server import EmbeddedZooKeeper

    work = tempfile.mkdtemp(prefix="rlm-", dir="/tmp")
    zks = [EmbeddedZooKeeper(data_dir=os.path.join(work, f"zk-{n}")) for n in ("source", "target")]
    clients = []
    try:
        for zk in zks:
            zk.start()
        ray.init(address="local", num_cpus=4, resources={DISK_RESOURCE: 1}, labels={NODE_LABEL: "local"},
                 include_dashboard=False, logging_level="WARNING", _temp_dir=os.path.join(work, "ray"))
        source = Client(zookeeper=zks[0].connect_string, cluster="source", data_dir=os.path.join(work, "src"),
                        data_host="127.0.0.1")
        target = Client(zookeeper=zks[1].connect_string, cluster="target", data_dir=os.path.join(work, "dst"),
                        data_host="127.0.0.1")
        clients = [source, target]
        source.create_topic(TOPIC, partitions=args.partitions)
        pad = b"x" * max(0, args.size - 24)

        # 1. prefill
        _note("prefill")
        producer = source.producer(acks="all", linger_ms=5, batch_size=500, compression=args.compression)
        for i in range(args.prefill):
            producer.send(TOPIC, b"%012d:" % i + pad, key=b"%d" % (i % 97))
        producer.flush()
        producer.close()

        # 2. the plain consume
        _note("plain consume")
        t0 = time.monotonic()
        plain = _read_all(source, TOPIC, args.partitions)
        plain_s = time.monotonic() - t0
        plain_rate = sum(map(len, plain.values())) / plain_s if plain_s > 0 else None

        # 3. the mirror catches up
        _note("mirror start")
        t0 = time.monotonic()
        mirror = target.mirror(source_zookeeper=zks[0].connect_string, source_cluster="source", topics=TOPIC,
                               members=args.members, name="bench", scan_interval_s=5.0)
        want_end = source.end_offsets(TOPIC)

        def mirrored() -> dict[int, int]:
            """Per partition, the source offset the mirror has copied up to
            (its progress records in the target's ZooKeeper)."""
            out = {}
            for p in range(args.partitions):
                path = mirror_spec.progress_path(target.settings.cluster, "bench", TOPIC, p)
                record, _ = mirror_progress.read_progress(target._zk, path)
                out[p] = 0 if record is None else (record["end"] if record["acked"] else record["start"])
            return out

        first_copy = None  # when the first set was copied (actor start-up over)
        copied_then = 0
        while True:
            ends = mirrored()
            if first_copy is None and any(ends.values()):
                first_copy = time.monotonic()
                copied_then = sum(ends.values())
            if ends == want_end:
                break
            if time.monotonic() - t0 > 600:
                raise TimeoutError("the mirror did not catch up in 600 s")
            time.sleep(0.05)
        done = time.monotonic()
        mirror_s = done - t0
        mirror_rate = args.prefill / mirror_s if mirror_s > 0 else None
        # the copy alone: the bytes after the first sighting, as a share of the messages
        total_bytes = sum(want_end.values())
        copy_rate = None
        if first_copy is not None and done > first_copy and total_bytes > copied_then:
            copy_rate = args.prefill * (total_bytes - copied_then) / total_bytes / (done - first_copy)

        # 4. under a steady producer: lag measured in the target
        _note("steady producer")
        lags: list[float] = []
        stop = threading.Event()
        start_offsets = target.end_offsets(TOPIC)

        def watch():
            consumer = target.consumer(TOPIC, auto_offset_reset="latest")
            try:
                for p, off in start_offsets.items():
                    consumer.seek(TOPIC, p, off)
                while not stop.is_set():
                    now = time.time()
                    lags.extend(now - m.timestamp / 1000.0 for m in consumer.poll(timeout_ms=200))
            finally:
                consumer.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        producer = source.producer(acks=1, linger_ms=2, compression=args.compression)
        sent, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < args.duration:
            due = int((time.monotonic() - t0) * args.rate)
            while sent < due:
                producer.send(TOPIC, b"%012d:" % (args.prefill + sent) + pad, key=b"%d" % (sent % 97))
                sent += 1
            time.sleep(0.005)
        producer.flush()
        producer.close()
        want_end = source.end_offsets(TOPIC)
        deadline = time.monotonic() + 300
        while target.end_offsets(TOPIC) != want_end and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        stop.set()
        watcher.join(timeout=30)

        # 5. exactly once, in order
        _note("read back")
        result = _compare(_read_all(source, TOPIC, args.partitions), _read_all(target, TOPIC, args.partitions))
        _note("stopping the mirror")
        mirror.stop()
        report = {
            **result,
            "messages": args.prefill + sent,
            "msg_per_s": None if mirror_rate is None else round(mirror_rate),
            "copy_msg_per_s": None if copy_rate is None else round(copy_rate),
            "plain_msg_per_s": None if plain_rate is None else round(plain_rate),
            "lag_p50_s": None if not lags else round(_percentile(lags, 0.5), 3),
            "lag_p99_s": None if not lags else round(_percentile(lags, 0.99), 3),
            "lag_samples": len(lags),
            "rate": args.rate,
            "partitions": args.partitions,
            "members": args.members,
            "compression": args.compression,
            # the target's log against the source's: 1.0 when every set went on as the source stores it
            "stored_ratio": round(sum(target.end_offsets(TOPIC).values()) / max(1, sum(source.end_offsets(TOPIC).values())), 3),
        }
        print(f"messages            {report['messages']}")
        print(f"plain consume       {report['plain_msg_per_s']} msg/s")
        print(f"mirror catch-up     {report['msg_per_s']} msg/s (actor start-up included)")
        print(f"mirror copy         {report['copy_msg_per_s']} msg/s (from the first copied set to the end; "
              f"{report['copy_msg_per_s'] / report['plain_msg_per_s'] if report['copy_msg_per_s'] and report['plain_msg_per_s'] else None} of the plain consume)")
        print(f"lag at {args.rate:.0f} msg/s  p50 {report['lag_p50_s']} s, p99 {report['lag_p99_s']} s "
              f"({len(lags)} samples; mean {statistics.mean(lags) if lags else None})")
        print(f"lost {result['lost']}, duplicated {result['duplicated']}, reordered partitions {result['reordered']}")
        print(f"target log / source log  {report['stored_ratio']} (compression {args.compression})")
        if args.json:
            print(json.dumps(report))
        return 0 if not (result["lost"] or result["duplicated"] or result["reordered"]) else 1
    finally:
        for client in reversed(clients):
            try:
                client.close()
            except Exception as err:  # noqa: BLE001
                print(f"closing a client failed: {err}", file=sys.stderr)
        if ray.is_initialized():
            ray.shutdown()
        for zk in zks:
            zk.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
