"""Storage benchmark: the partition log beside the raw limits of the same machine.

Each comparison runs its baseline and its candidates in alternating
repetitions (so that load from other processes hits both alike); rates are
medians over repetitions and ``ratio_to_*`` is the median of the per-repetition
ratios. Measured:

* ``raw_append``: plain 1 MiB ``os.write`` appends to a file (MB/s), the disk's
  and page cache's limit for a single writer;
* ``raw_frame`` / ``raw_parse``: bare Python loops that frame messages with
  just a length and a CRC32C, and parse them back checking the CRC (msg/s),
  the interpreter's limit for per-message work;
* ``log_append``: ``PartitionLog.append`` of pre-encoded sets of 50 and of
  1000 messages of 200 bytes (every CRC validated, one write per set), with
  the topic's default flush policy (fsync every 10,000 messages or 50 ms, the
  timer hook called after every append) and size retention keeping the disk
  use bounded;
* ``log_read``: reading the whole log back as a consumer does, ``read`` slices
  of 1 MiB, ``os.pread`` and ``decode_messages`` (every CRC checked), beside
  ``raw_parse``, the bare loop on the same fetches;
* ``decode``: ``decode_messages`` alone on one 1 MiB fetch held in memory,
  beside ``raw_parse_mem``, the bare loop on the same bytes (no I/O at all);
* ``encode``: ``encode_message_set`` of the same messages (the producer side).

The message code runs as ``--impl c`` (the compiled fast path of
``raylog.storage._speedups`` with the Python reference behind it; the default
when it is built), ``python`` (the reference alone) or ``both`` (the whole
suite once with each). Every line says which in its ``impl`` field.

Output: one JSON line per measurement (with ``ratio`` fields against the raw
limit it is compared to), then an aligned table. Usage::

    python bench/storage.py [--seconds 3] [--repetitions 6] [--dir /path/on/the/disk] [--json-only]
                            [--impl c|python|both]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from crc32c import crc32c  # noqa: E402

from raylog.config import MiB, TopicConfig  # noqa: E402
from raylog.storage import message as message_module  # noqa: E402
from raylog.storage.log import PartitionLog  # noqa: E402
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set  # noqa: E402

try:
    from raylog.storage import _speedups  # noqa: E402
except ImportError:
    _speedups = None

MESSAGE_BYTES = 200
SET_SIZES = (50, 1000)
REPETITIONS = 6
#: disk use of each writer is kept below about this many bytes
DISK_BUDGET = 512 * MiB

_LEN_CRC = struct.Struct(">II")


def interleaved(runs: dict, seconds: float, repetitions: int) -> dict:
    """Run each ``run(deadline) -> (units, bytes)`` of ``runs`` in turn,
    ``repetitions`` rounds of ``seconds / repetitions`` each; per run the list
    of ``(units/s, bytes/s)`` of every round."""
    rates = {name: [] for name in runs}
    for _ in range(repetitions):
        for name, run in runs.items():
            start = time.perf_counter()
            units, nbytes = run(start + seconds / repetitions)
            elapsed = time.perf_counter() - start
            rates[name].append((units / elapsed, nbytes / elapsed))
    return rates


def summary(rates: list, baseline: list | None = None, unit: int = 0) -> dict:
    """Medians of a run's rates, and the median ratio to a baseline's (by ``unit``: 0 msg, 1 bytes)."""
    out = {
        "msg_per_s": statistics.median(r[0] for r in rates),
        "mb_per_s": statistics.median(r[1] for r in rates) / 1e6,
    }
    if baseline is not None:
        out["ratio"] = statistics.median(r[unit] / b[unit] for r, b in zip(rates, baseline))
    return out


def make_values(count: int) -> list[bytes]:
    return [os.urandom(MESSAGE_BYTES) for _ in range(count)]


# -- raw limits ---------------------------------------------------------------------


class RawAppender:
    """Plain 1 MiB appends, to files of 256 MiB, keeping at most the disk budget."""

    FILE_BYTES = 256 * MiB

    def __init__(self, directory: str):
        self.directory = directory
        self.chunk = os.urandom(MiB)
        self.files: list[str] = []
        self.fd = None
        self.written = 0
        self._rotate()

    def _rotate(self):
        if self.fd is not None:
            os.close(self.fd)
        path = os.path.join(self.directory, f"raw-{len(self.files):04d}-{time.monotonic_ns()}")
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self.files.append(path)
        self.written = 0
        while len(self.files) * self.FILE_BYTES > DISK_BUDGET + self.FILE_BYTES:
            os.unlink(self.files.pop(0))

    def run(self, deadline):
        n = 0
        write, fd, chunk = os.write, self.fd, self.chunk
        while time.perf_counter() < deadline:
            write(fd, chunk)
            n += 1
            self.written += MiB
            if self.written >= self.FILE_BYTES:
                self._rotate()
                fd = self.fd
        return n, n * MiB

    def close(self):
        os.close(self.fd)
        for path in self.files:
            os.unlink(path)


def raw_frame(values: list[bytes]) -> bytes:
    pack = _LEN_CRC.pack
    return b"".join([part for v in values for part in (pack(len(v) + 4, crc32c(v)), v)])


def raw_parse(buf: bytes) -> tuple[list[bytes], int]:
    """The bare parse loop: a length and a CRC32C per message, nothing else.
    Stops at a message cut off by the end of ``buf``; returns payloads and bytes parsed."""
    view = memoryview(buf)
    unpack = _LEN_CRC.unpack_from
    out = []
    append = out.append
    pos, n = 0, len(buf)
    while pos + 8 <= n:
        size, crc = unpack(buf, pos)
        end = pos + 4 + size
        if end > n:
            break
        if crc32c(view[pos + 8 : end]) != crc:
            raise ValueError(f"bad CRC at {pos}")
        append(buf[pos + 8 : end])
        pos = end
    return out, pos


def repeat(fn, arg, units: int, nbytes: int):
    """A run that calls ``fn(arg)`` until the deadline."""

    def run(deadline):
        n = 0
        while time.perf_counter() < deadline:
            fn(arg)
            n += 1
        return n * units, n * nbytes

    return run


# -- the log ----------------------------------------------------------------------------


def appender(log: PartitionLog, set_size: int):
    """A run that appends pre-encoded sets as a partition actor does (timer hook, retention)."""
    sets = [encode_message_set(make_values(set_size)) for _ in range(max(4, 20_000 // set_size))]
    set_bytes = len(sets[0])

    def run(deadline):
        n = 0
        append, maybe_flush = log.append, log.maybe_flush
        now = time.perf_counter
        while True:
            for s in sets:
                append(s)
                maybe_flush()
            n += len(sets)
            if now() >= deadline:
                log.delete_old_segments()
                return n * set_size, n * set_bytes

    return run


def reader(log: PartitionLog, parse=None, fetch_bytes: int = MiB):
    """A run that reads the log as a consumer does: ``read`` slices, ``os.pread``
    and ``decode_messages`` (every CRC, header and size checked). With ``parse``
    (the bare loop) the same bytes are fetched the same way and parsed by it."""
    state = {"offset": log.log_start_offset}

    def run(deadline):
        msgs = nbytes = 0
        offset = max(state["offset"], log.log_start_offset)
        hw = log.high_watermark
        read, pread = log.read, os.pread
        while True:
            chunk = read(offset, fetch_bytes)
            data = pread(chunk.file.fileno(), chunk.length, chunk.position)
            if parse is None:
                records, consumed = decode_messages(data, offset)
            else:
                records, consumed = parse(data)
            msgs += len(records)
            nbytes += consumed
            offset += consumed
            if offset >= hw:
                offset = log.log_start_offset
            if time.perf_counter() >= deadline:
                state["offset"] = offset
                return msgs, nbytes

    return run


# -- main ---------------------------------------------------------------------------------


def use_implementation(impl: str) -> None:
    """Run the message code as ``impl``: "c" (the fast path) or "python" (the reference)."""
    fast = _speedups if impl == "c" else None
    message_module._speedups = fast
    message_module.ACCELERATED = fast is not None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement (default 3)")
    parser.add_argument("--repetitions", type=int, default=REPETITIONS, help="rounds per measurement (default 6)")
    parser.add_argument("--dir", help="directory on the disk to test (default: a temporary one)")
    parser.add_argument("--json-only", action="store_true", help="print the JSON lines only")
    parser.add_argument(
        "--impl", choices=["c", "python", "both"], default=None,
        help="message code: the compiled fast path, the Python reference, or each in turn "
        "(default: what raylog uses, c when it is built)",
    )
    args = parser.parse_args(argv)
    if args.impl is None:
        impls = ["c" if message_module.ACCELERATED else "python"]
    elif args.impl == "both":
        impls = ["c", "python"]
    else:
        impls = [args.impl]
    if "c" in impls and _speedups is None:
        parser.error("the compiled fast path (raylog.storage._speedups) is not built; pip install -e . builds it")

    results = []
    for impl in impls:
        use_implementation(impl)
        if not args.json_only:
            print(f"# impl={impl} (raylog.storage.message.ACCELERATED={message_module.ACCELERATED})", flush=True)
        run_suite(args, impl, results)

    if not args.json_only:
        print()
        print(f"{'impl':<8}{'case':<12}{'set':>6}{'msg/s':>14}{'MB/s':>10}   median ratio")
        for r in results:
            ratio = next(
                (f"{v:6.0%} of {k[len('ratio_to_'):]}" for k, v in r.items() if k.startswith("ratio_to_")), ""
            )
            msgs = f"{r['msg_per_s']:,.0f}" if "msg_per_s" in r else "-"
            print(
                f"{r['impl']:<8}{r['case']:<12}{r.get('set_size', '-')!s:>6}{msgs:>14}{r['mb_per_s']:>10.1f}   {ratio}"
            )
    return 0


def run_suite(args, impl: str, results: list) -> None:
    """Every measurement once, with the message code running as ``impl``."""
    seconds, reps = args.seconds, args.repetitions
    base = tempfile.mkdtemp(prefix="raylog-bench-", dir=args.dir)

    def emit(case: str, **fields) -> None:
        result = {"bench": "storage", "case": case, "impl": impl}
        result.update({k: round(v, 3) if isinstance(v, float) else v for k, v in fields.items()})
        results.append(result)
        print(json.dumps(result), flush=True)

    config = TopicConfig(retention_bytes=DISK_BUDGET)  # default segments and flush policy
    logs = {n: PartitionLog(os.path.join(base, f"log-{n}"), config) for n in SET_SIZES}
    raw = RawAppender(base)
    try:
        # appends: 1 MiB raw writes against the log, MB/s
        rates = interleaved(
            {"raw": raw.run, **{n: appender(logs[n], n) for n in SET_SIZES}}, seconds, reps
        )
        raw_mb = summary(rates["raw"])["mb_per_s"]
        emit("raw_append", write_bytes=MiB, mb_per_s=raw_mb)
        for n in SET_SIZES:
            s = summary(rates[n], rates["raw"], unit=1)
            emit(
                "log_append", set_size=n, message_bytes=MESSAGE_BYTES, msg_per_s=s["msg_per_s"],
                mb_per_s=s["mb_per_s"], payload_mb_per_s=s["msg_per_s"] * MESSAGE_BYTES / 1e6,
                raw_append_mb_per_s=raw_mb, ratio_to_raw_append=s["ratio"],
                flush_messages=config.flush_messages, flush_ms=config.flush_ms,
            )
        for log in logs.values():
            log.flush()

        # parsing: the same 1 MiB fetches of the log parsed by the bare loop and
        # by decode_messages, msg/s
        rates = interleaved(
            {"raw": reader(logs[1000], parse=raw_parse), **{n: reader(logs[n]) for n in SET_SIZES}},
            seconds, reps,
        )
        raw_parse_s = summary(rates["raw"])
        emit("raw_parse", fetch_bytes=MiB, **raw_parse_s)
        for n in SET_SIZES:
            s = summary(rates[n], rates["raw"], unit=0)
            emit(
                "log_read", set_size=n, message_bytes=MESSAGE_BYTES, fetch_bytes=MiB,
                msg_per_s=s["msg_per_s"], mb_per_s=s["mb_per_s"],
                raw_parse_msg_per_s=raw_parse_s["msg_per_s"], ratio_to_raw_parse=s["ratio"],
            )

        # parsing alone, in memory: one 1 MiB fetch of the log, msg/s
        chunk = logs[1000].read(logs[1000].log_start_offset, MiB)
        fetched = os.pread(chunk.file.fileno(), chunk.length, chunk.position)
        count = len(raw_parse(fetched)[0])
        rates = interleaved(
            {
                "raw": repeat(raw_parse, fetched, count, len(fetched)),
                "decode": repeat(lambda b: decode_messages(b, chunk.offset), fetched, count, len(fetched)),
            },
            seconds, reps,
        )
        raw_mem = summary(rates["raw"])
        emit("raw_parse_mem", messages=count, **raw_mem)
        s = summary(rates["decode"], rates["raw"], unit=0)
        emit(
            "decode", messages=count, message_bytes=MESSAGE_BYTES, msg_per_s=s["msg_per_s"],
            mb_per_s=s["mb_per_s"], raw_parse_mem_msg_per_s=raw_mem["msg_per_s"],
            ratio_to_raw_parse_mem=s["ratio"],
        )
        del chunk

        # framing: a bare length+CRC loop against encode_message_set, msg/s
        runs = {}
        for n in (1000, *SET_SIZES):
            vals = make_values(n)
            size = len(raw_frame(vals)) if n == 1000 and "raw" not in runs else len(encode_message_set(vals))
            if "raw" not in runs:
                runs["raw"] = repeat(raw_frame, vals, n, size)
            else:
                runs[n] = repeat(lambda v: encode_message_set(v, timestamp_ms=1), vals, n, size)
        rates = interleaved(runs, seconds, reps)
        raw_frame_s = summary(rates["raw"])
        emit("raw_frame", messages=1000, **raw_frame_s)
        for n in SET_SIZES:
            s = summary(rates[n], rates["raw"], unit=0)
            emit(
                "encode", set_size=n, message_bytes=MESSAGE_BYTES, msg_per_s=s["msg_per_s"],
                mb_per_s=s["mb_per_s"], raw_frame_msg_per_s=raw_frame_s["msg_per_s"],
                ratio_to_raw_frame=s["ratio"],
            )
    finally:
        raw.close()
        for log in logs.values():
            log.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
