"""End-to-end latency: from ``send`` to the consumer, at rates from 10 to 100,000 msg/s.

One partition, one producer paced at a fixed rate, one consumer long-polling
in another thread of the same process; each 200-byte value carries its send
time, and the consumer records ``receive time - send time`` for every
message. Measured for acks 1 and "all", with the default settings and with
a low-latency preset (producer ``linger_ms=0``; topic ``flush_ms=1``).

Prints one JSON line per case, then a table, and writes a PNG of p99
against rate (matplotlib, the ``bench`` extra) next to the JSON lines.

    python bench/latency.py                       # every rate, ~3 minutes
    python bench/latency.py --rates 20 10000 --presets default
    python bench/latency.py --out bench/results/latency

Each case starts on a settled disk (``os.sync()`` and a second's pause):
a log's sync waits behind the write-back of the previous case's data.
``ack_p99_ms`` (send -> acknowledgement, sampled) beside the end-to-end
figures tells a slow append from slow visibility (the flush, the long poll).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import threading
import time

RATES = (10, 20, 100, 1_000, 10_000, 100_000)
VALUE_BYTES = 200
_STAMP = struct.Struct(">dq")  # send time (time.time()), sequence number

PRESETS = {
    # what a user gets without choosing anything
    "default": {"producer": {}, "topic": {}},
    # every batch leaves as soon as the sender sees it; the log flushes each millisecond
    "low-latency": {"producer": {"linger_ms": 0}, "topic": {"flush_ms": 1}},
}


def _duration(rate: int, seconds: float) -> float:
    """Long enough for a p99 from at least ~300 samples, bounded."""
    return max(seconds, min(4 * seconds, 300.0 / rate))


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[k]


def run_case(client, rate: int, acks, preset: str, seconds: float) -> dict:
    import uuid

    settings = PRESETS[preset]
    topic = f"latency-{uuid.uuid4().hex[:8]}"
    # The previous case's writes and deleted segments are still being written
    # back and discarded; a sync (fsync) in the log waits behind them for
    # hundreds of ms on a virtual disk. Let the disk settle first, so that each
    # case measures its own traffic.
    os.sync()
    time.sleep(1.0)
    client.create_topic(topic, partitions=1, **settings["topic"])
    try:
        return _measure(client, topic, rate, acks, preset, settings, _duration(rate, seconds))
    finally:
        client.delete_topic(topic)


def _measure(client, topic, rate, acks, preset, settings, duration) -> dict:
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    latencies: list[float] = []
    # send -> acknowledgement, sampled (at most ~1,000 a second): tells a
    # slow append (producer, network, the log's append) from slow visibility
    # (flush, the long poll) when the end-to-end figure is high
    acks_ms: list[float] = []
    sample_every = max(1, rate // 1000)
    expected = [0]
    stop = threading.Event()
    sending_done = threading.Event()

    def consume():
        while not stop.is_set():
            batch = consumer.poll(timeout_ms=200)
            now = time.time()
            for message in batch:
                sent, _ = _STAMP.unpack_from(message.value)
                latencies.append(now - sent)
            if sending_done.is_set() and len(latencies) >= expected[0]:
                return

    reader = threading.Thread(target=consume, name="latency-consumer")
    reader.start()
    producer = client.producer(acks=acks, **settings["producer"])
    pad = b"x" * (VALUE_BYTES - _STAMP.size)
    time.sleep(0.5)  # both sides idle: the first message meets a quiet producer
    sent = 0
    start = time.perf_counter()
    wall = time.time() - start  # time.time() = wall + perf_counter(), read once
    interval = 1.0 / rate
    try:
        while True:
            now = time.perf_counter()
            elapsed = now - start
            if elapsed >= duration:
                break
            due = min(int(elapsed * rate) + 1, int(duration * rate))
            send = producer.send
            while sent < due:
                future = send(topic, _STAMP.pack(wall + time.perf_counter(), sent) + pad)
                if not sent % sample_every:
                    future.add_done_callback(_ack_timer(acks_ms))
                sent += 1
            next_at = start + sent * interval
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        achieved = sent / (time.perf_counter() - start)
        producer.flush()
    finally:
        expected[0] = sent
        sending_done.set()
        reader.join(timeout=30)
        stop.set()
        reader.join(timeout=10)
        producer.close()
        consumer.close()
    ms = sorted(x * 1000.0 for x in latencies)
    ack_ms = sorted(acks_ms)
    return {
        "case": "latency",
        "preset": preset,
        "acks": acks,
        "rate": rate,
        "achieved_rate": round(achieved),
        "messages": sent,
        "received": len(ms),
        "p50_ms": round(_percentile(ms, 0.50), 2),
        "p99_ms": round(_percentile(ms, 0.99), 2),
        "max_ms": round(ms[-1], 2) if ms else None,
        "ack_p99_ms": round(_percentile(ack_ms, 0.99), 2),
        "ack_max_ms": round(ack_ms[-1], 2) if ack_ms else None,
    }


def _ack_timer(out: list):
    """A done-callback recording send -> acknowledgement in ms."""
    sent_at = time.perf_counter()
    return lambda _future: out.append((time.perf_counter() - sent_at) * 1000.0)


def plot(rows: list[dict], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install raylog[bench]); no PNG", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict = {}
    for r in rows:
        series.setdefault((r["preset"], str(r["acks"])), []).append((r["achieved_rate"] or r["rate"], r["p99_ms"]))
    for (preset, acks), points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{preset}, acks={acks}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages per second (achieved)")
    ax.set_ylabel("p99 send → consumer (ms)")
    ax.set_title("raylog end-to-end latency, one partition")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=list(RATES))
    parser.add_argument("--acks", nargs="+", default=["1", "all"])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--seconds", type=float, default=3.0, help="shortest measuring time per case")
    parser.add_argument("--out", default="bench/results/latency", help="path prefix of the .jsonl and .png")
    args = parser.parse_args(argv)

    import raylog

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    rows: list[dict] = []
    load_before = os.getloadavg()
    with raylog.connect() as client, open(args.out + ".jsonl", "w") as out:
        for preset in args.presets:
            for acks in args.acks:
                acks_value = "all" if acks == "all" else int(acks)
                for rate in args.rates:
                    row = run_case(client, rate, acks_value, preset, args.seconds)
                    row["loadavg_1m"] = round(os.getloadavg()[0], 2)
                    rows.append(row)
                    line = json.dumps(row)
                    print(line, flush=True)
                    out.write(line + "\n")
    png = plot(rows, args.out + ".png")
    print()
    print(f"load average before: {load_before[0]:.2f} (1 min), cpus: {os.cpu_count()}")
    print(
        f"{'preset':<12} {'acks':>4} {'rate':>8} {'achieved':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'ack p99':>8} {'recv':>8}"
    )
    for r in rows:
        print(
            f"{r['preset']:<12} {str(r['acks']):>4} {r['rate']:>8,} {r['achieved_rate']:>9,} {r['p50_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['max_ms'] or float('nan'):>8.1f} {r['ack_p99_ms']:>8.1f} {r['received']:>8,}"
        )
    if png:
        print(f"\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
