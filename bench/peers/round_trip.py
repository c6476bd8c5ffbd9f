"""One acknowledged message at a time, raylog beside its peers, in one run.

What a request handler does: send one 200-byte message, wait until the
broker acknowledges it, send the next. Each case is set beside the floor
measured first in the same run (bench/floor.py: 222 bytes to another Python
process on 127.0.0.1 and a 16-byte reply, one at a time).

- raylog: ``producer.send(topic, value).result()`` with ``batch_size=1``,
  ``acks=1`` (in the partition's log, not yet fsynced) and ``acks="all"``
  (fsynced and visible);
- Redis Streams: a synchronous ``XADD`` (redis-py) on a ``redis-server``
  started here on 127.0.0.1 (bench/peers/brokers.py), its append-only file
  with ``appendfsync everysec`` (Redis' default: the reply comes before the
  fsync, like acks=1) and ``always`` (fsynced before the reply, like
  acks="all");
- RabbitMQ: a persistent message to a durable queue, its publisher confirm
  awaited before the next (pika's BlockingConnection);
- ActiveMQ: a persistent STOMP SEND, its receipt awaited before the next.

A peer that is not installed is skipped with the reason (bench/peers/setup.sh
installs RabbitMQ, ActiveMQ and Redis, and their clients). Every broker listens on 127.0.0.1 only and
is stopped by its PID.

    python bench/peers/round_trip.py [-n 20000] [--json-only]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.dirname(here))

from brokers import ActiveMQ, BrokerStartError, RabbitMQ, Redis  # noqa: E402 - beside this file
from floor import round_trips  # noqa: E402 - bench/floor.py

MESSAGE = b"x" * 200
WARM_UP = 200


def _row(case: str, n: int, seconds: float, **extra) -> dict:
    return {"case": case, "messages": n, "seconds": round(seconds, 3), "msg_per_s": round(n / seconds),
            "us_per_message": round(seconds / n * 1e6, 1), **extra}


def raylog_cases(n: int) -> list[dict]:
    import raylog

    rows = []
    with raylog.connect() as client:
        client.create_topic("round-trip", partitions=1)
        for acks in (1, "all"):
            producer = client.producer(batch_size=1, acks=acks)
            send = producer.send
            for _ in range(WARM_UP):
                send("round-trip", MESSAGE).result()
            t0 = time.perf_counter()
            for _ in range(n):
                send("round-trip", MESSAGE).result()
            rows.append(_row(f"raylog acks={acks}", n, time.perf_counter() - t0))
            producer.close()
    return rows


def redis_cases(n: int) -> list[dict]:
    import redis

    rows = []
    for fsync in ("everysec", "always"):
        with Redis(appendfsync=fsync) as broker:
            client = redis.Redis(host="127.0.0.1", port=broker.port)
            xadd = client.xadd
            fields = {b"v": MESSAGE}
            for _ in range(WARM_UP):
                xadd("round-trip", fields)
            t0 = time.perf_counter()
            for _ in range(n):
                xadd("round-trip", fields)
            rows.append(_row(f"redis streams XADD, appendfsync {fsync}", n, time.perf_counter() - t0))
            client.close()
    return rows


def rabbitmq_cases(n: int) -> list[dict]:
    import pika

    with RabbitMQ() as broker:
        conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=broker.port))
        channel = conn.channel()
        channel.queue_declare(queue="round-trip", durable=True)
        channel.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        publish = channel.basic_publish
        for _ in range(WARM_UP):
            publish("", "round-trip", MESSAGE, props)
        t0 = time.perf_counter()
        for _ in range(n):
            publish("", "round-trip", MESSAGE, props)  # returns once confirmed
        seconds = time.perf_counter() - t0
        conn.close()
    return [_row("rabbitmq persistent, confirm per message", n, seconds)]


def activemq_cases(n: int) -> list[dict]:
    import stomp

    with ActiveMQ() as broker:
        conn = stomp.Connection([("127.0.0.1", broker.port)], auto_content_length=True)
        receipts = {}

        class Listener(stomp.ConnectionListener):
            def on_receipt(self, frame):
                event = receipts.get(frame.headers.get("receipt-id"))
                if event is not None:
                    event.set()

        import threading

        conn.set_listener("", Listener())
        conn.connect(wait=True)

        def send(i: int) -> None:
            event = receipts[str(i)] = threading.Event()
            conn.send("/queue/round-trip", MESSAGE, headers={"persistent": "true", "receipt": str(i)})
            if not event.wait(30):
                raise RuntimeError("no STOMP receipt within 30 s")
            del receipts[str(i)]

        for i in range(WARM_UP):
            send(i)
        t0 = time.perf_counter()
        for i in range(WARM_UP, WARM_UP + n):
            send(i)
        seconds = time.perf_counter() - t0
        conn.disconnect()
    return [_row("activemq persistent STOMP, receipt per message", n, seconds)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=20_000)
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--peers", default="redis,rabbitmq,activemq", help="comma-separated peers to run")
    args = parser.parse_args(argv)
    load_before = " ".join(open("/proc/loadavg").read().split()[:3])
    floor = {"case": "floor: one round trip per message", "messages": args.messages}
    floor["msg_per_s"] = round(round_trips(args.messages))
    rows = [floor]
    print(json.dumps(floor), flush=True)
    runners = {"redis": redis_cases, "rabbitmq": rabbitmq_cases, "activemq": activemq_cases}
    cases = [("raylog", raylog_cases)] + [(p, runners[p]) for p in args.peers.split(",") if p]
    skipped = []
    for name, run in cases:
        try:
            got = run(args.messages)
        except (BrokerStartError, ImportError) as err:
            skipped.append(f"{name}: {str(err).splitlines()[0]}")
            print(json.dumps({"case": name, "skipped": str(err).splitlines()[0]}), flush=True)
            continue
        for row in got:
            row["vs_floor"] = round(row["msg_per_s"] / floor["msg_per_s"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if not args.json_only:
        print()
        print(f"{'case (one acknowledged message at a time)':<52} {'msg/s':>9} {'us/msg':>8} {'/floor':>7}")
        for r in rows:
            us = f"{r['us_per_message']:>8.1f}" if "us_per_message" in r else f"{1e6 / r['msg_per_s']:>8.1f}"
            ratio = f"{r['vs_floor']:>7.2f}" if "vs_floor" in r else f"{'':>7}"
            print(f"{r['case']:<52} {r['msg_per_s']:>9,} {us} {ratio}")
        for line in skipped:
            print(f"skipped {line}")
        after = " ".join(open("/proc/loadavg").read().split()[:3])
        print(f"load average (1/5/15 min) before {load_before}, after {after}; {os.cpu_count()} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
