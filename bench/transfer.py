"""Data channel benchmark: produce and fetch throughput over loopback.

A bare :class:`DataServer` serves one real :class:`PartitionLog` (default
topic config: flush every 10,000 messages or 50 ms, from a timer thread as
the partition actor does) in this process; the client runs in a child
process, so that client and server do not share one interpreter lock.
Messages are 200-byte values without keys; sets are encoded once up front
(the producer's encoding is measured by ``bench/storage.py``).

Scenarios (messages per second, each run for about ``--seconds``):

* ``produce_b50_acks0``: ``produce()`` of 50-message sets, acks=0;
* ``produce_b50_acks1``: ``produce_many()`` of 20 such sets per write, acks=1;
* ``produce_b1_acks0``: ``produce()`` of single-message sets, one frame per
  message, acks=0 (the server joins the frames it finds in one read);
* ``produce_b1_many``: ``produce_many()`` of 100 single-message frames per
  write, acks=0;
* ``fetch``: ``fetch()`` of 1 MiB at a time from the start (bytes only);
* ``consume``: the same plus ``decode_messages`` (every CRC checked), as a
  consumer does.

A produce run ends with an OFFSETS round trip, so every frame counted was
handled. Output: one JSON line per scenario, then a table. Usage::

    python bench/transfer.py [--seconds 3] [--dir /path/on/the/disk]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from raylog.config import MiB, TopicConfig  # noqa: E402

TOPIC = "bench"
VALUE_BYTES = 200
SCENARIOS = ("produce_b50_acks0", "produce_b50_acks1", "produce_b1_acks0", "produce_b1_many", "fetch", "consume")


def client(address, scenario: str, seconds: float, results, socket_buffer_bytes=None) -> None:
    """The child process: run one scenario, send back ``(messages, bytes, elapsed)``."""
    from raylog.storage.decoding import decode_messages
    from raylog.storage.message import encode_message_set
    from raylog.transfer.connection import BrokerConnection

    conn = BrokerConnection(*address, socket_buffer_bytes=socket_buffer_bytes)
    value = b"v" * VALUE_BYTES
    one = encode_message_set([value])
    fifty = encode_message_set([value] * 50)
    messages = nbytes = 0
    start = time.perf_counter()
    deadline = start + seconds
    if scenario == "produce_b50_acks0":
        while time.perf_counter() < deadline:
            for _ in range(100):
                conn.produce(TOPIC, 0, fifty, acks=0)
            messages += 5000
            nbytes += 100 * len(fifty)
    elif scenario == "produce_b50_acks1":
        sets = [fifty] * 20
        while time.perf_counter() < deadline:
            conn.produce_many(TOPIC, 0, sets, acks=1)
            messages += 1000
            nbytes += 20 * len(fifty)
    elif scenario == "produce_b1_acks0":
        while time.perf_counter() < deadline:
            for _ in range(1000):
                conn.produce(TOPIC, 0, one, acks=0)
            messages += 1000
            nbytes += 1000 * len(one)
    elif scenario == "produce_b1_many":
        sets = [one] * 100
        while time.perf_counter() < deadline:
            conn.produce_many(TOPIC, 0, sets, acks=0)
            messages += 100
            nbytes += 100 * len(one)
    else:
        offset, end = conn.offsets(TOPIC, 0)
        start = time.perf_counter()
        while offset < end and time.perf_counter() < start + seconds:
            result = conn.fetch(TOPIC, 0, offset, 1 * MiB)
            if scenario == "consume":
                records, consumed = decode_messages(result.data, offset)
                messages += len(records)
            else:  # every message has the same size: whole ones end on a multiple
                consumed = len(result.data) - len(result.data) % len(one)
                messages += consumed // len(one)
            offset += consumed
            nbytes += len(result.data)
    conn.offsets(TOPIC, 0)  # every frame sent so far has been handled
    results.send((messages, nbytes, time.perf_counter() - start))
    conn.close()


def run(args) -> list[dict]:
    from raylog.storage.log import PartitionLog
    from raylog.transfer.server import DataServer

    directory = tempfile.mkdtemp(prefix="raylog-bench-transfer-", dir=args.dir)
    plog = PartitionLog(os.path.join(directory, f"{TOPIC}-0"), TopicConfig(flush_messages=args.flush_messages))
    stopping = threading.Event()

    def flush_timer():  # the partition actor's timer, in short
        while not stopping.wait(0.005):
            plog.maybe_flush()

    timer = threading.Thread(target=flush_timer, daemon=True)
    timer.start()
    server = DataServer(
        lambda topic, partition: plog if (topic, partition) == (TOPIC, 0) else None,
        socket_buffer_bytes=args.socket_buffer_bytes,
    )
    address = server.start()
    context = multiprocessing.get_context("spawn")
    rows = []
    try:
        for scenario in args.scenarios:
            plog.flush()
            cpu = time.process_time()
            receiver, sender = context.Pipe(duplex=False)
            child = context.Process(
                target=client, args=(address, scenario, args.seconds, sender, args.socket_buffer_bytes)
            )
            child.start()
            messages, nbytes, elapsed = receiver.recv()
            child.join(60)
            row = {
                "scenario": scenario,
                "msg_per_s": round(messages / elapsed),
                "mb_per_s": round(nbytes / elapsed / 1e6, 1),
                "messages": messages,
                "seconds": round(elapsed, 2),
                "server_cpu_s": round(time.process_time() - cpu, 2),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        server.stop()
        stopping.set()
        timer.join(5)
        plog.close()
        shutil.rmtree(directory, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each scenario")
    parser.add_argument("--dir", default=None, help="where the log goes (default: the temp dir)")
    parser.add_argument(
        "--flush-messages", type=int, default=TopicConfig().flush_messages, help="the topic's flush_messages"
    )
    parser.add_argument(
        "--socket-buffer-bytes", type=int, default=None, help="SO_SNDBUF/SO_RCVBUF (default: kernel auto-tuning)"
    )
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    rows = run(parser.parse_args())
    print()
    print(f"{'scenario':<20} {'msg/s':>12} {'MB/s':>8} {'server cpu s':>13}")
    for row in rows:
        print(f"{row['scenario']:<20} {row['msg_per_s']:>12,} {row['mb_per_s']:>8} {row['server_cpu_s']:>13}")


if __name__ == "__main__":
    main()
