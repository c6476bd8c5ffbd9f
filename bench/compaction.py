"""Compaction benchmark: the log cleaner of a compacted topic (docs/design.md §3).

On a file log (:class:`raylog.storage.log.PartitionLog`, no Ray), measured:

* ``clean``: one pass over a log of ``--records`` records over ``--keys``
  keys (values of ``--value-bytes``, batches of ``--batch`` records, segments
  of ``--segment-mib``): MB/s of dirty log cleaned (bytes the pass read over
  its wall time; ``mb_per_cpu_s``: over the process's CPU time, which a
  loaded machine disturbs less), records removed, the bytes before and after;
* ``read_back``: a reader from the log start after cleaning (as the consumer
  reads: each read at the last batch's next offset): whether it gets exactly
  the latest value of each key, and how many records it reads;
* ``floor``: the least any cleaner pays for those bytes, measured in the
  same run on the same files (the machine may be shared and loaded): read
  them a MiB at a time and check their CRC32C (the ``crc32c`` package), in
  MB/s; ``clean`` reports ``floor_ratio``, its MB/s over the floor's;
* ``produce``: the latency of appends (``append`` of one batch, the topic's
  flush policy) while no cleaner runs and while one cleans the same log in a
  loop on another thread: p50 and p99 in ms, and ``p99_ratio`` (while
  cleaning / not, the quiet p99 being the floor of the same run; the
  acceptance asks for at most 2);
* ``summary``: the medians over ``--runs`` runs of the above, and the load
  average of the machine before and after.

``--python`` runs the cleaner's pure-Python reference (without
``raylog.storage._compaction``), to compare.

The cleaner's I/O bound is set high (``--io-mbps``, default 10 000) so that
the pass runs as fast as it can; the partition actor's default is
``DEFAULT_IO_BYTES_PER_S``.

Output: one JSON line per measurement, then a short table (``--json-only``:
the lines alone). Usage::

    python bench/compaction.py [--records 1000000] [--keys 10000] [--runs 3] [--python] [--dir /path] [--json-only]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from crc32c import crc32c  # noqa: E402

from raylog.config import MiB, TopicConfig  # noqa: E402
from raylog.storage import cleaner, offsetmap  # noqa: E402
from raylog.storage.cleaner import Throttler  # noqa: E402
from raylog.storage.log import PartitionLog  # noqa: E402
from raylog.storage.record_batch import decode_batch, encode_batch, iter_batches, next_offset_after  # noqa: E402


def fill(log: PartitionLog, records: int, keys: int, value_bytes: int, batch: int, start: int = 0,
         shuffle: bool = False) -> dict:
    """Append ``records`` records over ``keys`` keys (in turn, or at random
    with ``shuffle``: then many batches keep some of their records only);
    the latest value of each key."""
    latest = {}
    pad = b"." * max(0, value_bytes - 12)
    rng = random.Random(start)
    for first in range(start, start + records, batch):
        n = min(batch, start + records - first)
        if shuffle:
            ks = [b"key-%d" % rng.randrange(keys) for i in range(n)]
        else:
            ks = [b"key-%d" % ((first + i) % keys) for i in range(n)]
        vs = [b"%011d" % (first + i) + pad for i in range(n)]
        log.append(encode_batch(vs, keys=ks))
        latest.update(zip(ks, vs))
    log.flush()
    return latest


def read_back(log: PartitionLog) -> dict:
    """``key -> value`` as a reader from the log start gets them (the last wins), and the records read."""
    table, count = {}, 0
    offset = log.log_start_offset
    while offset < log.high_watermark:
        data = log.read(offset, 4 * MiB).tobytes()
        if not data:
            break
        for pos, header in iter_batches(data):
            if header.control:
                continue
            for record in decode_batch(data, pos, from_offset=offset).records:
                table[record.key] = record.value
                count += 1
        offset = next_offset_after(data, len(data))
    return {"table": table, "records": count}


def produce_latencies(log: PartitionLog, seconds: float, keys: int, value_bytes: int, batch: int,
                      start: int) -> list[float]:
    """Append one batch at a time for ``seconds``; each append's latency (s)."""
    out = []
    pad = b"." * max(0, value_bytes - 12)
    i = start
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        data = encode_batch([b"%011d" % (i + j) + pad for j in range(batch)],
                            keys=[b"key-%d" % ((i + j) % keys) for j in range(batch)])
        t0 = time.perf_counter()
        log.append(data)
        log.maybe_flush()
        out.append(time.perf_counter() - t0)
        i += batch
        time.sleep(0.001)  # a producer's pace, not a flood
    return out


def floor_mb_per_s(directory: str) -> float:
    """MB/s of reading the segment files of ``directory`` a MiB at a time and checking their CRC32C."""
    total, buffer = 0, bytearray(MiB)
    view = memoryview(buffer)
    t0 = time.perf_counter()
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".log"):
            continue
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            pos = 0
            while True:
                got = os.preadv(fd, [view], pos)
                if not got:
                    break
                crc32c(view[:got])
                pos += got
                total += got
        finally:
            os.close(fd)
    return total / (time.perf_counter() - t0) / 1e6


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000.0


def run(args, root: str, emit, number: int) -> tuple[dict, dict, dict]:
    """One run: the ``clean`` (with its floor), ``read_back`` and ``produce`` measurements."""
    config = TopicConfig(cleanup_policy="compact", segment_bytes=args.segment_mib * MiB,
                         max_message_bytes=min(MiB, args.segment_mib * MiB), min_cleanable_dirty_ratio=0.01)
    with PartitionLog(os.path.join(root, f"p{number}"), config) as log:
        latest = fill(log, args.records, args.keys, args.value_bytes, args.batch, shuffle=args.shuffle)
        log.maybe_roll(now=time.time() + 10**9)  # the last records leave the active segment too
        before = log.size_bytes
        floor = floor_mb_per_s(log.directory)
        t0, cpu0 = time.perf_counter(), time.process_time()
        result = log.clean(throttler=Throttler(args.io_mbps * 1e6), force=True)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        mb_per_s = result.bytes_read / seconds / 1e6
        clean = {"bench": "clean", "run": number, "implementation": IMPLEMENTATION, "shuffle": args.shuffle,
                 "records": args.records,
                 "keys": args.keys, "bytes_before": before, "bytes_after": log.size_bytes,
                 "dirty_bytes": result.dirty_bytes, "bytes_read": result.bytes_read,
                 "records_removed": result.records_removed, "seconds": round(seconds, 3),
                 "mb_per_s": round(mb_per_s, 2), "cpu_seconds": round(cpu, 3),
                 "mb_per_cpu_s": round(result.bytes_read / max(cpu, 1e-9) / 1e6, 2), "floor_mb_per_s": round(floor, 2),
                 "floor_ratio": round(mb_per_s / floor, 3)}
        emit(clean)
        got = read_back(log)
        back = {"bench": "read_back", "run": number, "records_read": got["records"], "keys": len(got["table"]),
                "exactly_latest": got["table"] == latest}
        emit(back)

    # produce latency with and without a cleaner on the same log
    with PartitionLog(os.path.join(root, f"q{number}"), config) as log:
        fill(log, args.records // 2, args.keys, args.value_bytes, args.batch)
        quiet = produce_latencies(log, args.produce_seconds, args.keys, args.value_bytes, args.batch,
                                  args.records)
        stop = threading.Event()
        passes = [0]

        def cleaning():
            while not stop.is_set():
                if log.clean(throttler=Throttler(args.io_mbps * 1e6), force=True) is not None:
                    passes[0] += 1
                else:
                    time.sleep(0.01)

        cleaner_thread = threading.Thread(target=cleaning, daemon=True)
        cleaner_thread.start()
        busy = produce_latencies(log, args.produce_seconds, args.keys, args.value_bytes, args.batch,
                                 args.records * 2)
        stop.set()
        cleaner_thread.join()
        produce = {"bench": "produce", "run": number, "appends_quiet": len(quiet), "appends_cleaning": len(busy),
                   "p50_ms_quiet": round(pct(quiet, 0.5), 3), "p99_ms_quiet": round(pct(quiet, 0.99), 3),
                   "p50_ms_cleaning": round(pct(busy, 0.5), 3), "p99_ms_cleaning": round(pct(busy, 0.99), 3),
                   "p99_ratio": round(pct(busy, 0.99) / max(pct(quiet, 0.99), 1e-9), 2),
                   "cleaning_passes": passes[0], "mean_ms_quiet": round(statistics.mean(quiet) * 1000, 3)}
        emit(produce)
    return clean, back, produce


IMPLEMENTATION = "compiled" if cleaner._compaction is not None else "python"  # noqa: SLF001


def main(argv=None) -> int:
    global IMPLEMENTATION
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--segment-mib", type=int, default=16)
    parser.add_argument("--io-mbps", type=float, default=10_000)
    parser.add_argument("--produce-seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shuffle", action="store_true", help="keys at random (many partly kept batches)")
    parser.add_argument("--python", action="store_true", help="the cleaner's pure-Python reference")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if args.python:
        cleaner._compaction = offsetmap._compaction = None  # noqa: SLF001
    IMPLEMENTATION = "compiled" if cleaner._compaction is not None else "python"  # noqa: SLF001

    root = tempfile.mkdtemp(prefix="raylog-compaction-", dir=args.dir)

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)

    load_before = os.getloadavg()
    runs = []
    try:
        for number in range(args.runs):
            runs.append(run(args, root, emit, number))
            for name in os.listdir(root):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()

    def median(kind: int, field: str) -> float:
        return round(statistics.median(r[kind][field] for r in runs), 3)

    summary = {"bench": "summary", "implementation": IMPLEMENTATION, "runs": args.runs, "shuffle": args.shuffle,
               "mb_per_s": median(0, "mb_per_s"), "mb_per_cpu_s": median(0, "mb_per_cpu_s"),
               "floor_mb_per_s": median(0, "floor_mb_per_s"),
               "floor_ratio": median(0, "floor_ratio"),
               "exactly_latest": all(r[1]["exactly_latest"] for r in runs),
               "p99_ms_quiet": median(2, "p99_ms_quiet"), "p99_ms_cleaning": median(2, "p99_ms_cleaning"),
               "p99_ratio": median(2, "p99_ratio"),
               "loadavg_before": [round(x, 2) for x in load_before],
               "loadavg_after": [round(x, 2) for x in load_after], "cpus": os.cpu_count()}
    emit(summary)
    if not args.json_only:
        clean = runs[0][0]
        print()
        print(f"{'measurement (median of ' + str(args.runs) + ' runs)':<36}{'value':>20}")
        for name, value in (("implementation", IMPLEMENTATION),
                            ("clean MB/s", summary["mb_per_s"]),
                            ("clean MB per CPU second", summary["mb_per_cpu_s"]),
                            ("floor MB/s (read + CRC32C)", summary["floor_mb_per_s"]),
                            ("clean / floor", summary["floor_ratio"]),
                            ("records removed (run 0)", clean["records_removed"]),
                            ("bytes before -> after (run 0)", f"{clean['bytes_before']}->{clean['bytes_after']}"),
                            ("read back exactly latest", summary["exactly_latest"]),
                            ("produce p99 ms quiet", summary["p99_ms_quiet"]),
                            ("produce p99 ms cleaning", summary["p99_ms_cleaning"]),
                            ("p99 ratio (acceptance: <= 2)", summary["p99_ratio"]),
                            ("load average before", " ".join(map(str, summary["loadavg_before"]))),
                            ("load average after", " ".join(map(str, summary["loadavg_after"])))):
            print(f"{name:<36}{value!s:>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
