"""Throughput as the log grows, and the partition actor's memory under a
consumer backlog.

One producer writes 200-byte messages (``send_batch``, 50 per call,
``acks=0``) to a one-partition topic in steps of ``--step-mb`` until the log
holds ``--gb`` GB; each step's produce rate is printed. Then, with the whole
log as the backlog, one consumer reads a step's worth from the start (the
oldest segment) and a step's worth from the last step (the newest), and the
partition actor's RSS is sampled throughout. The claim (the paper's): the
rate does not fall as the log grows, and the broker's memory does not grow
with the backlog (reads go through the page cache and ``sendfile``).

The disk's floor, in the same run: after each produce step, the same
number of bytes appended to a plain file that grows beside the log (1 MiB
writes, then ``fdatasync``, as the log's flush makes the step's data
durable before the high watermark covers it), in ``--floor-dir`` (the
temporary directory by default; on this machine the same disk as the
log). The first gigabytes of both go to the page cache; once the kernel
holds back writers for its dirty pages, both run at the disk's pace. The
``/ floor`` column is what the claim is about: a rate that keeps its ratio
to the floor as the log grows does not depend on the log's size.

The issue's range is 1 GB to 20 GB; on a shared machine the default here is
smaller (2 GB in steps of 200 MB); say so when quoting it.

    python bench/scale.py                 # 2 GB
    python bench/scale.py --gb 20 --step-mb 1000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MESSAGE = b"x" * 200
SIZE = 22 + len(MESSAGE)


def _rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 1e6


def _consume(client, topic: str, start: int, messages: int) -> float:
    consumer = client.consumer(topic, auto_offset_reset="earliest", fetch_max_bytes=1 << 20)
    consumer.seek(topic, 0, start)
    got = 0
    t0 = time.perf_counter()
    while got < messages:
        batches = consumer.poll_batch(timeout_ms=10_000, max_messages=100_000)
        if not batches:
            raise RuntimeError(f"consumer stalled after {got} of {messages}")
        got += sum(map(len, batches))
    seconds = time.perf_counter() - t0
    consumer.close()
    return got / seconds


def _floor_step(fd: int, chunk: bytes, size: int) -> float:
    """Seconds to append ``size`` bytes to ``fd`` and make them durable."""
    t0 = time.perf_counter()
    left = size
    while left > 0:
        left -= os.write(fd, chunk if left >= len(chunk) else chunk[:left])
    os.fdatasync(fd)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--step-mb", type=int, default=200)
    parser.add_argument("--floor-dir", default=None, help="where the floor's plain file grows (default: the temp dir)")
    args = parser.parse_args(argv)

    import tempfile

    import ray

    import raylog

    floor_fd, floor_path = tempfile.mkstemp(prefix="raylog-scale-floor-", dir=args.floor_dir)
    chunk = b"x" * (1 << 20)
    steps = max(1, int(args.gb * 1000 / args.step_mb))
    per_step = args.step_mb * 1_000_000 // SIZE // 50 * 50
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    with raylog.connect() as client:
        client.create_topic("scale", partitions=1)
        pid = ray.get(client.partition_actor("scale", 0).pid.remote())
        producer = client.producer(batch_size=50, linger_ms=5, acks=0, max_buffered_messages=200_000)
        values = [MESSAGE] * 50
        rss = [_rss_mb(pid)]
        for step in range(steps):
            start_hw = client.offsets("scale", 0)[1]
            t0 = time.perf_counter()
            for _ in range(per_step // 50):
                producer.send_batch("scale", values)
            producer.flush()
            while client.offsets("scale", 0)[1] < start_hw + per_step * SIZE:
                time.sleep(0.002)
            seconds = time.perf_counter() - t0
            rss.append(_rss_mb(pid))
            floor = _floor_step(floor_fd, chunk, per_step * SIZE)
            rows.append({"case": "produce", "log_gb": round((step + 1) * per_step * SIZE / 1e9, 2),
                         "msg_per_s": round(per_step / seconds), "actor_rss_mb": round(rss[-1]),
                         "floor_msg_per_s": round(per_step / floor),
                         "vs_floor": round(floor / seconds, 2)})
            print(json.dumps(rows[-1]), flush=True)
        producer.close()
        os.close(floor_fd)
        os.unlink(floor_path)
        end = client.offsets("scale", 0)[1]
        for where, start in (("oldest", 0), ("newest", end - per_step * SIZE)):
            rate = _consume(client, "scale", start, per_step)
            rss.append(_rss_mb(pid))
            rows.append({"case": f"consume {where} step, {round(end / 1e9, 2)} GB backlog",
                         "msg_per_s": round(rate), "actor_rss_mb": round(rss[-1])})
            print(json.dumps(rows[-1]), flush=True)
        client.delete_topic("scale")
    produce = [r for r in rows if r["case"] == "produce"]
    summary = {"case": "summary",
               "last_vs_first_produce": round(produce[-1]["msg_per_s"] / produce[0]["msg_per_s"], 2),
               "last_vs_first_floor": round(produce[-1]["floor_msg_per_s"] / produce[0]["floor_msg_per_s"], 2),
               "vs_floor_first": produce[0]["vs_floor"], "vs_floor_last": produce[-1]["vs_floor"],
               "vs_floor_min": min(r["vs_floor"] for r in produce), "vs_floor_max": max(r["vs_floor"] for r in produce),
               "max_actor_rss_mb": round(max(rss)), "load_before": load_before,
               "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()), "cpus": os.cpu_count()}
    print(json.dumps(summary))
    print()
    print(f"{'case':<44} {'log GB':>6} {'msg/s':>11}  {'floor msg/s':>11} {'/ floor':>7}  actor RSS")
    for r in rows:
        floor = f"{r['floor_msg_per_s']:>11,} {r['vs_floor']:>7.2f}" if "vs_floor" in r else f"{'':>11} {'':>7}"
        print(f"{r['case']:<44} {r.get('log_gb', ''):>6} {r['msg_per_s']:>11,}  {floor}  {r['actor_rss_mb']:>5} MB")
    print(f"produce at the last step vs the first: x{summary['last_vs_first_produce']} (the floor's: "
          f"x{summary['last_vs_first_floor']}); / floor at the first step {summary['vs_floor_first']}, at the last "
          f"{summary['vs_floor_last']} (every step {summary['vs_floor_min']} to {summary['vs_floor_max']}); "
          f"partition actor RSS at most {summary['max_actor_rss_mb']} MB")
    print("floor: the same bytes appended to a plain file growing beside the log, fdatasync'd per step (same run)")
    print(f"load average (1/5/15 min) before {load_before}, after {summary['load_after']}; {os.cpu_count()} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
