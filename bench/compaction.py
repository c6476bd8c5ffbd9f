"""Compaction benchmark: the log cleaner of a compacted topic (docs/design.md §3).

On a file log (:class:`raylog.storage.log.PartitionLog`, no Ray), measured:

* ``clean``: one pass over a log of ``--records`` records over ``--keys``
  keys (values of ``--value-bytes``, batches of ``--batch`` records, segments
  of ``--segment-mib``): MB/s of dirty log cleaned (bytes the pass read over
  its wall time), records removed, the bytes before and after;
* ``read_back``: a reader from the log start after cleaning (as the consumer
  reads: each read at the last batch's next offset): whether it gets exactly
  the latest value of each key, and how many records it reads;
* ``produce``: the latency of appends (``append`` of one batch, the topic's
  flush policy) while no cleaner runs and while one cleans the same log in a
  loop on another thread: p50 and p99 in ms, and ``p99_ratio`` (while
  cleaning / not; the acceptance asks for at most 2).

The cleaner's I/O bound is set high (``--io-mbps``, default 10 000) so that
the pass runs as fast as it can; the partition actor's default is
``DEFAULT_IO_BYTES_PER_S``.

Output: one JSON line per measurement, then a short table (``--json-only``:
the lines alone). Usage::

    python bench/compaction.py [--records 1000000] [--keys 10000] [--dir /path/on/the/disk] [--json-only]
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

from raylog.config import MiB, TopicConfig  # noqa: E402
from raylog.storage.cleaner import Throttler  # noqa: E402
from raylog.storage.log import PartitionLog  # noqa: E402
from raylog.storage.record_batch import decode_batch, encode_batch, iter_batches, next_offset_after  # noqa: E402


def fill(log: PartitionLog, records: int, keys: int, value_bytes: int, batch: int, start: int = 0) -> dict:
    """Append ``records`` records over ``keys`` keys; the latest value of each key."""
    latest = {}
    pad = b"." * max(0, value_bytes - 12)
    for first in range(start, start + records, batch):
        n = min(batch, start + records - first)
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


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--segment-mib", type=int, default=16)
    parser.add_argument("--io-mbps", type=float, default=10_000)
    parser.add_argument("--produce-seconds", type=float, default=5.0)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)

    root = tempfile.mkdtemp(prefix="raylog-compaction-", dir=args.dir)
    lines = []

    def emit(row: dict) -> None:
        lines.append(row)
        print(json.dumps(row), flush=True)

    config = TopicConfig(cleanup_policy="compact", segment_bytes=args.segment_mib * MiB,
                         max_message_bytes=min(MiB, args.segment_mib * MiB), min_cleanable_dirty_ratio=0.01)
    try:
        with PartitionLog(os.path.join(root, "p"), config) as log:
            latest = fill(log, args.records, args.keys, args.value_bytes, args.batch)
            log.maybe_roll(now=time.time() + 10**9)  # the last records leave the active segment too
            before = log.size_bytes
            t0 = time.perf_counter()
            result = log.clean(throttler=Throttler(args.io_mbps * 1e6), force=True)
            seconds = time.perf_counter() - t0
            emit({"bench": "clean", "records": args.records, "keys": args.keys, "bytes_before": before,
                  "bytes_after": log.size_bytes, "dirty_bytes": result.dirty_bytes, "bytes_read": result.bytes_read,
                  "records_removed": result.records_removed, "seconds": round(seconds, 3),
                  "mb_per_s": round(result.bytes_read / seconds / 1e6, 2)})
            got = read_back(log)
            emit({"bench": "read_back", "records_read": got["records"], "keys": len(got["table"]),
                  "exactly_latest": got["table"] == latest})

        # produce latency with and without a cleaner on the same log
        with PartitionLog(os.path.join(root, "q"), config) as log:
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

            cleaner = threading.Thread(target=cleaning, daemon=True)
            cleaner.start()
            busy = produce_latencies(log, args.produce_seconds, args.keys, args.value_bytes, args.batch,
                                     args.records * 2)
            stop.set()
            cleaner.join()
            emit({"bench": "produce", "appends_quiet": len(quiet), "appends_cleaning": len(busy),
                  "p50_ms_quiet": round(pct(quiet, 0.5), 3), "p99_ms_quiet": round(pct(quiet, 0.99), 3),
                  "p50_ms_cleaning": round(pct(busy, 0.5), 3), "p99_ms_cleaning": round(pct(busy, 0.99), 3),
                  "p99_ratio": round(pct(busy, 0.99) / max(pct(quiet, 0.99), 1e-9), 2),
                  "cleaning_passes": passes[0], "mean_ms_quiet": round(statistics.mean(quiet) * 1000, 3)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not args.json_only:
        print()
        print(f"{'measurement':<28}{'value':>16}")
        clean, back, produce = lines
        for name, value in (("clean MB/s", clean["mb_per_s"]), ("records removed", clean["records_removed"]),
                            ("bytes before -> after", f"{clean['bytes_before']}->{clean['bytes_after']}"),
                            ("read back exactly latest", back["exactly_latest"]),
                            ("records read back", back["records_read"]),
                            ("produce p99 ms quiet", produce["p99_ms_quiet"]),
                            ("produce p99 ms cleaning", produce["p99_ms_cleaning"]),
                            ("p99 ratio", produce["p99_ratio"])):
            print(f"{name:<28}{value!s:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
