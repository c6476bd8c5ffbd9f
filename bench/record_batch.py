"""Micro-benchmark of the two record formats: encode, validate and decode, in records/s.

Format 1 (:mod:`raylog.storage.message`: ``encode_message_set``,
``validate_message_set``, ``decode_messages``) and format 2
(:mod:`raylog.storage.record_batch`: ``encode_batch``, ``validate_batch``,
``decode_batch``) run on the same records (values of ``--value-bytes`` bytes,
no key, one timestamp) in batches of 1 and of 50, uncompressed, in
alternating repetitions (so that load from other processes hits both alike).
Rates are medians over repetitions; ``ratio`` is the median of the
per-repetition ratios format 2 / format 1 (above 1: format 2 is faster).

``--impl c`` (the default when ``raylog.storage._speedups`` is built) uses
the compiled fast paths of both formats, ``python`` the Python references
alone, ``both`` runs the suite once with each.

Output: one JSON line per measurement, then an aligned table. Usage::

    python bench/record_batch.py [--seconds 0.3] [--repetitions 5] [--value-bytes 100] [--impl c|python|both]
                                 [--json-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from raylog.storage import message as message_module
from raylog.storage import record_batch
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.storage.validation import validate_message_set

BATCH_SIZES = (1, 50)
OPERATIONS = ("encode", "validate", "decode")


def _use(impl: str) -> None:
    """Switch both formats' code to ``impl`` (``c`` or ``python``)."""
    from raylog.storage import _speedups

    fast = _speedups if impl == "c" else None
    message_module._speedups = fast
    message_module.ACCELERATED = fast is not None
    record_batch._speedups = fast
    record_batch.ACCELERATED = fast is not None


def _calls(fmt: int, op: str, batch: int, value_bytes: int):
    """A no-argument function doing ``op`` once on one batch of ``batch`` records."""
    values = [bytes([65 + i % 26]) * value_bytes for i in range(batch)]
    ts = 1_700_000_000_000
    if fmt == 1:
        encoded = encode_message_set(values, None, ts)
        return {
            "encode": lambda: encode_message_set(values, None, ts),
            "validate": lambda: validate_message_set(encoded),
            "decode": lambda: decode_messages(encoded, 0),
        }[op]
    encoded = record_batch.encode_batch(values, None, None, ts)
    return {
        "encode": lambda: record_batch.encode_batch(values, None, None, ts),
        "validate": lambda: record_batch.validate_batch(encoded),
        "decode": lambda: record_batch.decode_batch(encoded),
    }[op]


def _rate(fn, batch: int, seconds: float) -> float:
    """Records per second of ``fn`` (one batch per call) over about ``seconds``."""
    calls = 0
    loops = 16
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(loops):
            fn()
        calls += loops
        now = time.perf_counter()
        if now >= deadline:
            return calls * batch / (now - start)


def run(impl: str, seconds: float, repetitions: int, value_bytes: int) -> list[dict]:
    _use(impl)
    rows = []
    for op in OPERATIONS:
        for batch in BATCH_SIZES:
            f1 = _calls(1, op, batch, value_bytes)
            f2 = _calls(2, op, batch, value_bytes)
            r1, r2, ratios = [], [], []
            for _ in range(repetitions):
                a = _rate(f1, batch, seconds)
                b = _rate(f2, batch, seconds)
                r1.append(a)
                r2.append(b)
                ratios.append(b / a)
            rows.append(
                {
                    "bench": "record_batch",
                    "impl": impl,
                    "operation": op,
                    "batch": batch,
                    "value_bytes": value_bytes,
                    "format1_records_per_s": round(statistics.median(r1)),
                    "format2_records_per_s": round(statistics.median(r2)),
                    "ratio": round(statistics.median(ratios), 3),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="time per measurement (default 0.3)")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--impl", choices=("c", "python", "both"), default=None)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    impl = args.impl or ("c" if record_batch._speedups is not None else "python")
    impls = ("c", "python") if impl == "both" else (impl,)
    rows = []
    for one in impls:
        for row in run(one, args.seconds, args.repetitions, args.value_bytes):
            print(json.dumps(row), flush=True)
            rows.append(row)
    if not args.json_only:
        print()
        print(f"{'impl':<7}{'operation':<10}{'batch':>6}{'format 1 rec/s':>17}{'format 2 rec/s':>17}{'2/1':>7}")
        for r in rows:
            print(
                f"{r['impl']:<7}{r['operation']:<10}{r['batch']:>6}{r['format1_records_per_s']:>17,}"
                f"{r['format2_records_per_s']:>17,}{r['ratio']:>7.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
