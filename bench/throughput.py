"""The paper's throughput experiment, through the real cluster.

One producer sends N 200-byte messages to a one-partition topic, in
batches of 1 and of 50 (``acks=0``, as in the paper; the clock stops when
the partition's high watermark covers every byte, i.e. the data is in the
log and flushed), then one consumer reads them all back. In the same run:

* keyed batches of 50 (``send_batch`` with a key per message, 8 partitions:
  the keyed batch path) beside keyless ones on the same topic;
* the idempotent producer on and off (``acks=1``, where idempotence
  applies), alternated over several rounds;
* the naive baseline: the same 200-byte messages, 50 per call, moved into
  a plain Ray actor by method calls and fetched back the same way.

The acknowledged round trip: one message at a time, ``send(...).result()``
(``batch_size=1``, ``acks=1`` and ``acks="all"``), what a request handler
does, set beside the floor's round trip (bench/floor.py: 222 bytes to
another Python process on 127.0.0.1 and a 16-byte reply, one at a time).

Also ``send_many`` of all N values in one call, and the consume side
through ``poll_batch`` (views of the fetched sets) beside ``poll``. The
machine's floor (bench/floor.py: framing + CRC32C, parsing + CRC, one
send() per message) is measured first, in the same run, and every produce
and consume figure is set beside it.

Prints one JSON line per measurement, then a table with the ratios and the
load average (the machine may be shared).

    python bench/throughput.py                 # N = 1,000,000
    python bench/throughput.py -n 200000 --json-only
    python bench/throughput.py --replication   # RF 1 vs 3 on three disk nodes (bench/replication.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MESSAGE = b"x" * 200


def _emit(rows: list, row: dict, json_only: bool) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


#: how long the high watermarks stay still before the records are counted
SETTLED_S = 0.2


def _wait_until_stored(client, topic: str, starts: dict, n: int, timeout_s: float = 300.0) -> float:
    """Wait until the partitions (``starts``: partition -> high watermark before
    the sends) hold ``n`` more records, visible; the ``time.perf_counter()`` at
    which their high watermarks last moved (the clock stops there). A log's size
    in bytes depends on how the producer cut its batches (a record batch's
    header is shared by its records), so the records are counted (COUNT, on
    the partitions' nodes) once the watermarks have settled, outside the
    clock."""
    deadline = time.monotonic() + timeout_s
    last, moved_at = None, time.perf_counter()
    while True:
        ends = {p: client.offsets(topic, p)[1] for p in starts}
        now = time.perf_counter()
        if ends != last:
            last, moved_at = ends, now
        elif now - moved_at >= SETTLED_S:
            stored = sum(client.count_messages(topic, p, starts[p], ends[p], max_walk_bytes=1 << 40) or 0
                         for p in starts)
            if stored >= n:
                return moved_at
            moved_at = now  # still coming: count again after the next settling
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: {n} records did not become visible within {timeout_s} s")
        time.sleep(0.002)


def bench_produce(client, topic: str, n: int, batch: int, per_call: int = 1) -> dict:
    """``per_call`` 1: one ``send`` per message (the paper's producer);
    more: ``send_batch`` with that many messages per call (the same calls
    the actor baseline makes)."""
    start_hw = client.offsets(topic, 0)[1]
    producer = client.producer(batch_size=batch, linger_ms=5, acks=0, max_buffered_messages=200_000)
    t0 = time.perf_counter()
    if per_call == 1:
        send = producer.send
        for _ in range(n):
            send(topic, MESSAGE)
    elif per_call == n:
        producer.send_many(topic, [MESSAGE] * n)
    else:
        values = [MESSAGE] * per_call
        send_batch = producer.send_batch
        for _ in range(n // per_call):
            send_batch(topic, values)
        n = (n // per_call) * per_call
    producer.flush()
    sent_s = time.perf_counter() - t0
    seconds = _wait_until_stored(client, topic, {0: start_hw}, n) - t0
    producer.close()
    return {
        "case": f"raylog produce batch {batch}"
        + ("" if per_call == 1 else ", send_many" if per_call == n else f", {per_call} per call"),
        "messages": n,
        "seconds": round(seconds, 3),
        "send_seconds": round(sent_s, 3),
        "msg_per_s": round(n / seconds),
        "mb_per_s": round(n * len(MESSAGE) / seconds / 1e6, 2),
    }


def bench_keyed(client, topic: str, n: int, keyed: bool, partitions: int) -> dict:
    """50 messages per ``send_batch`` call to a topic of ``partitions``
    partitions, with a key per message (1,000 distinct keys) or without."""
    start = {p: client.offsets(topic, p)[1] for p in range(partitions)}
    keys = [b"user-%04d" % (i % 1000) for i in range(1000)]
    per_call = 50
    calls = n // per_call
    n = calls * per_call
    producer = client.producer(batch_size=50, linger_ms=5, acks=0, max_buffered_messages=200_000)
    values = [MESSAGE] * per_call
    key_slices = [keys[i : i + per_call] for i in range(0, 1000, per_call)]
    t0 = time.perf_counter()
    send_batch = producer.send_batch
    if keyed:
        for c in range(calls):
            send_batch(topic, values, key_slices[c % len(key_slices)])
    else:
        for _ in range(calls):
            send_batch(topic, values)
    producer.flush()
    sent_s = time.perf_counter() - t0
    seconds = _wait_until_stored(client, topic, start, n) - t0
    producer.close()
    return {
        "case": f"raylog produce {'keyed' if keyed else 'keyless'} batch 50, 50 per call, {partitions} partitions",
        "messages": n,
        "seconds": round(seconds, 3),
        "send_seconds": round(sent_s, 3),
        "msg_per_s": round(n / seconds),
        "mb_per_s": round(n * len(MESSAGE) / seconds / 1e6, 2),
    }


def bench_idempotence(client, topic: str, n: int, idempotent: bool) -> dict:
    """acks=1 (idempotence needs replies), 50 messages per call, one partition."""
    producer = client.producer(
        batch_size=50, linger_ms=5, acks=1, enable_idempotence=idempotent, max_buffered_messages=200_000
    )
    values = [MESSAGE] * 50
    calls = n // 50
    t0 = time.perf_counter()
    send_batch = producer.send_batch
    for _ in range(calls):
        send_batch(topic, values)
    producer.flush()
    seconds = time.perf_counter() - t0
    producer.close()
    n = calls * 50
    return {
        "case": f"raylog produce acks=1 batch 50, idempotence {'on' if idempotent else 'off'}",
        "messages": n,
        "seconds": round(seconds, 3),
        "msg_per_s": round(n / seconds),
        "mb_per_s": round(n * len(MESSAGE) / seconds / 1e6, 2),
    }


def bench_round_trip(client, topic: str, n: int, acks) -> dict:
    """One acknowledged message at a time: ``send(...).result()``, the next
    sent once the previous is acknowledged (``batch_size=1``)."""
    producer = client.producer(batch_size=1, acks=acks)
    send = producer.send
    for _ in range(200):  # the connection set up, the partition warm
        send(topic, MESSAGE).result()
    t0 = time.perf_counter()
    for _ in range(n):
        send(topic, MESSAGE).result()
    seconds = time.perf_counter() - t0
    producer.close()
    return {
        "case": f"raylog round trip acks={acks}",
        "messages": n,
        "seconds": round(seconds, 3),
        "msg_per_s": round(n / seconds),
        "mb_per_s": round(n * len(MESSAGE) / seconds / 1e6, 2),
        "us_per_message": round(seconds / n * 1e6, 1),
    }


#: messages of each round-trip case (one at a time: a few seconds)
ROUND_TRIP_MESSAGES = 20_000


def bench_consume(client, topic: str, n: int, batches: bool = False) -> dict:
    """Read ``n`` messages back through ``poll`` (Message tuples) or, with
    ``batches``, through ``poll_batch`` (views of the fetched sets)."""
    consumer = client.consumer(topic, auto_offset_reset="earliest", fetch_max_bytes=1 << 20)
    poll = consumer.poll_batch if batches else consumer.poll
    received = 0
    t0 = time.perf_counter()
    while received < n:
        got = poll(timeout_ms=10_000, max_messages=100_000)
        if not got:
            raise RuntimeError(f"consumer stalled after {received} of {n} messages")
        received += sum(map(len, got)) if batches else len(got)
    seconds = time.perf_counter() - t0
    consumer.close()
    return {
        "case": "raylog consume" + (" (poll_batch)" if batches else " (poll)"),
        "messages": received,
        "seconds": round(seconds, 3),
        "msg_per_s": round(received / seconds),
        "mb_per_s": round(received * len(MESSAGE) / seconds / 1e6, 2),
    }


def bench_actor_baseline(n: int, batch: int = 50) -> list[dict]:
    import ray

    @ray.remote(num_cpus=0)
    class NaiveLog:
        def __init__(self):
            self.messages: list[bytes] = []

        def produce(self, values: list[bytes]) -> int:
            base = len(self.messages)
            self.messages.extend(values)
            return base

        def fetch(self, start: int, count: int) -> list[bytes]:
            return self.messages[start : start + count]

    naive = NaiveLog.remote()
    ray.get(naive.produce.remote([]))
    values = [MESSAGE] * batch
    t0 = time.perf_counter()
    refs = []
    for _ in range(n // batch):
        refs.append(naive.produce.remote(values))
        if len(refs) >= 256:
            ray.get(refs)
            refs.clear()
    ray.get(refs)
    produce_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    received = 0
    while received < (n // batch) * batch:
        got = ray.get(naive.fetch.remote(received, batch))
        received += len(got)
    fetch_s = time.perf_counter() - t0
    ray.kill(naive)
    total = (n // batch) * batch
    return [
        {
            "case": f"actor calls produce batch {batch}",
            "messages": total,
            "seconds": round(produce_s, 3),
            "msg_per_s": round(total / produce_s),
            "mb_per_s": round(total * len(MESSAGE) / produce_s / 1e6, 2),
        },
        {
            "case": f"actor calls fetch batch {batch}",
            "messages": total,
            "seconds": round(fetch_s, 3),
            "msg_per_s": round(total / fetch_s),
            "mb_per_s": round(total * len(MESSAGE) / fetch_s / 1e6, 2),
        },
    ]


#: partitions of the keyed/keyless comparison
KEYED_PARTITIONS = 8
#: the paired keyed / keyless cases (keyed first)
KEYED_CASES = (
    f"raylog produce keyed batch 50, 50 per call, {KEYED_PARTITIONS} partitions",
    f"raylog produce keyless batch 50, 50 per call, {KEYED_PARTITIONS} partitions",
)
#: alternated rounds of each paired comparison; the best of each side is kept
ROUNDS = 5
#: the floor each case is set beside (bench/floor.py)
FLOOR_OF = {"produce": "floor: framing + CRC32C", "consume": "floor: parsing + CRC"}


def _has_poll_batch() -> bool:
    from raylog.consumer.consumer import Consumer

    return hasattr(Consumer, "poll_batch")


def _uptime() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def _median_ratio(by_case: dict, cases: tuple[str, str]) -> float:
    """The ratio of the median rounds of two paired cases (a spike in one
    round moves the best of either side, not its median)."""
    import statistics

    top, bottom = (statistics.median(by_case[c]["rounds"]) for c in cases)
    return top / bottom


def _best(rows: list[dict]) -> dict:
    best = dict(max(rows, key=lambda r: r["msg_per_s"]))
    best["rounds"] = [r["msg_per_s"] for r in rows]
    return best


#: the floor the acknowledged round trips are set beside (bench/floor.py)
ROUND_TRIP_FLOOR = "floor: one round trip per message"


def _table(rows: list) -> None:
    print()
    print(f"{'case':<60} {'messages':>10} {'seconds':>8} {'msg/s':>11} {'MB/s':>8} {'/floor':>7}")
    for r in rows:
        ratio = r.get("vs_floor", r.get("vs_round_trip_floor"))
        ratio = f"{ratio:>7.2f}" if ratio is not None else f"{'':>7}"
        seconds = f"{r['seconds']:>8.2f}" if "seconds" in r else f"{'':>8}"
        print(f"{r['case']:<60} {r['messages']:>10,} {seconds} {r['msg_per_s']:>11,} {r['mb_per_s']:>8.1f} {ratio}")
    print("/floor: produce cases against framing + CRC32C, consume cases against parsing + CRC, round trips "
          "against one round trip per message (same run)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=1_000_000)
    parser.add_argument("--batch1-messages", type=int, default=None, help="N for batch 1 (default: N)")
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--round-trips", type=int, default=ROUND_TRIP_MESSAGES,
                        help="messages of each acknowledged round-trip case")
    parser.add_argument("--round-trip-only", action="store_true",
                        help="the floors and the acknowledged round trips alone")
    parser.add_argument("--replication", action="store_true",
                        help="replication factor 1 vs 3 side by side instead (bench/replication.py; -n as given, "
                             "200,000 by default)")
    args, rest = parser.parse_known_args(argv)
    if args.replication:
        from replication import main as replication_main  # bench/replication.py, beside this file

        n = args.messages if args.messages != parser.get_default("messages") else 200_000
        return replication_main(["-n", str(n), *(["--json-only"] if args.json_only else []), *rest])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    n = args.messages
    n1 = args.batch1_messages or n

    import raylog

    rows: list[dict] = []
    load_before = os.getloadavg()
    uptime_before = _uptime()
    from floor import measure  # bench/floor.py, beside this file

    floor = {}
    for row in measure():
        floor[row["case"]] = row["msg_per_s"]
        _emit(rows, row, args.json_only)
    with raylog.connect() as client:
        client.create_topic("bench-round-trip", partitions=1)
        for acks in (1, "all"):
            _emit(rows, bench_round_trip(client, "bench-round-trip", args.round_trips, acks), args.json_only)
        if args.round_trip_only:
            return _report(rows, floor, load_before, uptime_before, args.json_only, full=False)
        topic = "bench"
        client.create_topic(topic, partitions=1)
        _emit(rows, bench_produce(client, topic, n, 50), args.json_only)
        _emit(rows, bench_produce(client, topic, n1, 1), args.json_only)
        _emit(rows, bench_produce(client, topic, n, 50, per_call=50), args.json_only)
        _emit(rows, bench_produce(client, topic, n, 50, per_call=n), args.json_only)
        _emit(rows, bench_consume(client, topic, 3 * n + n1), args.json_only)
        if _has_poll_batch():
            _emit(rows, bench_consume(client, topic, 3 * n + n1, batches=True), args.json_only)

        client.create_topic("bench-keyed", partitions=KEYED_PARTITIONS)
        keyed_rows: dict[bool, list] = {True: [], False: []}
        for _ in range(ROUNDS):  # alternated, so that a load spike hits both sides
            for keyed in (False, True):
                keyed_rows[keyed].append(bench_keyed(client, "bench-keyed", n, keyed, KEYED_PARTITIONS))
        for keyed in (False, True):
            _emit(rows, _best(keyed_rows[keyed]), args.json_only)

        client.create_topic("bench-idempotence", partitions=1)
        idem_rows: dict[bool, list] = {True: [], False: []}
        for _ in range(ROUNDS):
            for idempotent in (False, True):
                idem_rows[idempotent].append(bench_idempotence(client, "bench-idempotence", n, idempotent))
        for idempotent in (False, True):
            _emit(rows, _best(idem_rows[idempotent]), args.json_only)

        for row in bench_actor_baseline(n):
            _emit(rows, row, args.json_only)

    return _report(rows, floor, load_before, uptime_before, args.json_only)


def _report(rows: list, floor: dict, load_before, uptime_before: str, json_only: bool, full: bool = True) -> int:
    by_case = {r["case"]: r for r in rows}
    round_trip_floor = floor[ROUND_TRIP_FLOOR]
    for r in rows:
        if r["case"].startswith("raylog round trip"):
            r["vs_round_trip_floor"] = round(r["msg_per_s"] / round_trip_floor, 2)
    if not full:
        summary = {"case": "ratios", "vs_round_trip_floor": {
            r["case"]: r["vs_round_trip_floor"] for r in rows if "vs_round_trip_floor" in r}}
        summary["load_before"], summary["load_after"] = uptime_before, _uptime()
        print(json.dumps(summary), flush=True)
        if not json_only:
            _table(rows)
            print(f"load average (1/5/15 min) before {uptime_before}, after {_uptime()}; {os.cpu_count()} cpus")
        return 0
    # Like for like: 50 messages per call on both sides.
    produce_ratio = (
        by_case["raylog produce batch 50, 50 per call"]["msg_per_s"] / by_case["actor calls produce batch 50"]["msg_per_s"]
    )
    consume_ratio = by_case["raylog consume (poll)"]["msg_per_s"] / by_case["actor calls fetch batch 50"]["msg_per_s"]
    keyed_ratio = (
        by_case[f"raylog produce keyed batch 50, 50 per call, {KEYED_PARTITIONS} partitions"]["msg_per_s"]
        / by_case[f"raylog produce keyless batch 50, 50 per call, {KEYED_PARTITIONS} partitions"]["msg_per_s"]
    )
    idempotence_ratio = (
        by_case["raylog produce acks=1 batch 50, idempotence on"]["msg_per_s"]
        / by_case["raylog produce acks=1 batch 50, idempotence off"]["msg_per_s"]
    )
    summary = {
        "case": "ratios",
        "produce_vs_actor_calls": round(produce_ratio, 2),
        "consume_vs_actor_calls": round(consume_ratio, 2),
        "keyed_vs_keyless": round(keyed_ratio, 2),
        "keyed_vs_keyless_medians": round(_median_ratio(by_case, KEYED_CASES), 2),
        "idempotence_on_vs_off": round(idempotence_ratio, 2),
        "cpus": os.cpu_count(),
        "loadavg_1m_before": round(load_before[0], 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    summary["load_before"], summary["load_after"] = uptime_before, _uptime()
    for r in rows:
        kind = "produce" if "produce" in r["case"] else "consume" if "consume" in r["case"] else None
        if kind is not None:
            r["vs_floor"] = round(r["msg_per_s"] / floor[FLOOR_OF[kind]], 2)
    summary["vs_floor"] = {r["case"]: r["vs_floor"] for r in rows if "vs_floor" in r}
    summary["batch1_vs_send_floor"] = round(
        by_case["raylog produce batch 1"]["msg_per_s"] / floor["floor: one send() per message"], 2
    )
    summary["vs_round_trip_floor"] = {r["case"]: r["vs_round_trip_floor"] for r in rows if "vs_round_trip_floor" in r}
    print(json.dumps(summary), flush=True)
    if not json_only:
        _table(rows)
        print(
            f"\nsendfile channel vs actor calls (50 messages per call on both sides): "
            f"produce x{produce_ratio:.1f}, consume x{consume_ratio:.1f}"
        )
        print(
            f"keyed vs keyless batch 50: x{keyed_ratio:.2f} (best rounds), x{summary['keyed_vs_keyless_medians']:.2f} "
            f"(median rounds); idempotence on vs off (acks=1): x{idempotence_ratio:.2f}"
        )
        print(f"load average (1/5/15 min) before {uptime_before}, after {_uptime()}; {os.cpu_count()} cpus")
        print("paper (2011, one broker): produce batch 50 ~400k msg/s, batch 1 ~50k msg/s, consume ~22k msg/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
