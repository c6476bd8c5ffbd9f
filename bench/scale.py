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

The steps' rates follow the disk as much as the log: the first step goes
to the page cache, later ones wait for writeback, and a shared virtual
disk changes pace within a run. So the size claim itself is measured in
pairs, after the growth: a second topic is grown to ``--reference-gb``
(1 GB, the issue's reference size: the rounds span it), then ``--rounds``
rounds each append ``--paired-step-mb`` to the small log and to the big
one, back to back (the order alternating), and each round reads that much
back from the end of each. Both logs then meet the same page cache, writeback and disk; the
medians' ratio, big over small, is the figure: 1.0 when the log's size
costs nothing.

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


def _produce_step(client, producer, topic: str, messages: int) -> float:
    """Messages per second to append ``messages`` (50 per ``send_batch``
    call) and see the high watermark cover them."""
    values = [MESSAGE] * 50
    start_hw = client.offsets(topic, 0)[1]
    t0 = time.perf_counter()
    for _ in range(messages // 50):
        producer.send_batch(topic, values)
    producer.flush()
    while client.offsets(topic, 0)[1] < start_hw + messages * SIZE:
        time.sleep(0.002)
    return messages / (time.perf_counter() - t0)


def _paired(client, producer, big: str, small: str, rounds: int, messages: int) -> list[dict]:
    """Rounds of one step appended to each log, then one read back from the
    end of each, back to back (which log goes first alternates)."""
    import statistics

    rows = []
    for r in range(rounds):
        order = (small, big) if r % 2 == 0 else (big, small)
        for topic in order:
            rate = _produce_step(client, producer, topic, messages)
            rows.append({"case": "paired produce", "topic": topic, "round": r + 1,
                         "log_gb": round(client.offsets(topic, 0)[1] / 1e9, 2), "msg_per_s": round(rate)})
            print(json.dumps(rows[-1]), flush=True)
        for topic in order:
            end = client.offsets(topic, 0)[1]
            rate = _consume(client, topic, end - messages * SIZE, messages)
            rows.append({"case": "paired consume", "topic": topic, "round": r + 1,
                         "log_gb": round(end / 1e9, 2), "msg_per_s": round(rate)})
            print(json.dumps(rows[-1]), flush=True)
    for case in ("paired produce", "paired consume"):
        medians = {t: statistics.median(x["msg_per_s"] for x in rows if x["case"] == case and x["topic"] == t)
                   for t in (big, small)}
        rows.append({"case": f"{case}, median", "big_msg_per_s": round(medians[big]),
                     "small_msg_per_s": round(medians[small]), "big_vs_small": round(medians[big] / medians[small], 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


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
    parser.add_argument("--reference-gb", type=float, default=1.0,
                        help="the small log of the paired rounds (default 1 GB; none when not below --gb)")
    parser.add_argument("--rounds", type=int, default=9, help="paired rounds (default 9)")
    parser.add_argument("--paired-step-mb", type=int, default=200, help="appended and read per log per round")
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
        rss = [_rss_mb(pid)]
        for step in range(steps):
            rate = _produce_step(client, producer, "scale", per_step)
            rss.append(_rss_mb(pid))
            floor = _floor_step(floor_fd, chunk, per_step * SIZE)
            rows.append({"case": "produce", "log_gb": round((step + 1) * per_step * SIZE / 1e9, 2),
                         "msg_per_s": round(rate), "actor_rss_mb": round(rss[-1]),
                         "floor_msg_per_s": round(per_step / floor),
                         "vs_floor": round(rate * floor / per_step, 2)})
            print(json.dumps(rows[-1]), flush=True)
        os.close(floor_fd)
        os.unlink(floor_path)
        paired = []
        if args.reference_gb < args.gb and args.rounds > 0:
            client.create_topic("scale-small", partitions=1)
            # grown so that the rounds' middle step ends at the reference size
            # (the rounds span it, as the big log's span --gb)
            step_msgs = args.paired_step_mb * 1_000_000 // SIZE // 50 * 50
            start = max(step_msgs, int(args.reference_gb * 1e9) // SIZE - (args.rounds + 1) // 2 * step_msgs)
            _produce_step(client, producer, "scale-small", start // 50 * 50)  # (growing it: not a figure)
            paired = _paired(client, producer, "scale", "scale-small", args.rounds, step_msgs)
            rss.append(_rss_mb(pid))
            client.delete_topic("scale-small")
        producer.close()
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
               **{f"{r['case'].split(',')[0].replace(' ', '_')}_big_vs_small": r["big_vs_small"]
                  for r in paired if "big_vs_small" in r},
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
    medians = [r for r in paired if "big_vs_small" in r]
    if medians:
        print()
        print(f"paired rounds ({args.rounds}, {args.paired_step_mb} MB per log per round, alternating): the log at "
              f"{round(end / 1e9, 1)} GB vs a log at {args.reference_gb} GB, same page cache and disk")
        print(f"{'round':>5}  {'case':<16} {'big msg/s':>11} {'small msg/s':>11} {'ratio':>6}")
        for r in range(1, args.rounds + 1):
            for case in ("paired produce", "paired consume"):
                rates = {x["topic"]: x["msg_per_s"] for x in paired if x["case"] == case and x.get("round") == r}
                print(f"{r:>5}  {case[7:]:<16} {rates['scale']:>11,} {rates['scale-small']:>11,} "
                      f"{rates['scale'] / rates['scale-small']:>6.2f}")
        for m in medians:
            print(f"{'median':>5}  {m['case'][7:-8]:<16} {m['big_msg_per_s']:>11,} {m['small_msg_per_s']:>11,} "
                  f"{m['big_vs_small']:>6.2f}")
    print(f"load average (1/5/15 min) before {load_before}, after {summary['load_after']}; {os.cpu_count()} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
