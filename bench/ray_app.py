"""The Ray-app path, warm: Ray tasks hand batches of 200-byte messages to
producer actors (``send_batch``), as a Ray application feeds raylog.

Everything is started and warmed up before the clock starts (the actors,
their connections, the task workers); the clock runs from the first task
submitted until every task's ``send_batch`` calls are acknowledged
(``acks=1``) and the producers are flushed. Tasks pick an actor round-robin
and keep ``in_flight`` calls outstanding each. In the same run:

* the same messages sent by one producer in the driver (``send_batch``, 50
  per call): the in-process figure;
* Ray's own ceiling for those calls: the same tasks making the same calls
  to as many actors whose ``send_batch`` does nothing (async, as the
  producer actor). A call's cost in Ray (submitting it, its argument
  through the object store once it passes ``max_direct_call_object_size``,
  100 KB by default: 1,000 messages of 200 bytes are 200 KB) bounds what
  any actor can take per call; ``/ceiling`` says how close the producer
  actors come to it.

Bigger calls pay Ray's cost per call less often: the figures are given
per ``--per-call``.

    python bench/ray_app.py                       # 1,000,000 messages, 4 tasks, 1 and 2 actors, 1000 and 5000 per call
    python bench/ray_app.py -n 300000 --tasks 8 --actors 1 2 4 --per-call 50 1000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MESSAGE = b"x" * 200
PER_CALL = 50


def _feed(actors, messages: int, in_flight: int, per_call: int = PER_CALL) -> int:
    """A Ray task's work: ``messages`` messages in calls of ``per_call``,
    spread over ``actors``, ``in_flight`` calls outstanding."""
    import ray

    values = [MESSAGE] * per_call
    pending, sent, i = [], 0, 0
    while sent < messages:
        pending.append(actors[i % len(actors)].send_batch.remote("ray-app", values))
        i += 1
        sent += per_call
        if len(pending) >= in_flight:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
    ray.get(pending)
    return sent


class NoopActor:
    """Takes ``send_batch`` calls and does nothing: Ray's ceiling."""

    async def send_batch(self, topic, values, keys=None, partition=None) -> int:
        return len(values)

    async def flush(self) -> dict:
        return {}

    async def close(self) -> dict:
        return {}


def bench_actors(client, n: int, tasks: int, actors: int, in_flight: int, per_call: int, noop: bool = False) -> dict:
    import ray

    if noop:
        handles = [ray.remote(num_cpus=0.5)(NoopActor).remote() for _ in range(actors)]
    else:
        handles = [client.producer_actor(batch_size=PER_CALL, linger_ms=5, acks=1) for _ in range(actors)]
    feed = ray.remote(num_cpus=0)(_feed)
    ray.get([feed.remote(handles, per_call * 20, 4, per_call) for _ in range(tasks)])  # warm: workers, connections
    ray.get([h.flush.remote() for h in handles])
    per_task = (n // tasks // per_call) * per_call
    t0 = time.perf_counter()
    total = sum(ray.get([feed.remote(handles, per_task, in_flight, per_call) for _ in range(tasks)]))
    ray.get([h.flush.remote() for h in handles])
    seconds = time.perf_counter() - t0
    for h in handles:
        ray.get(h.close.remote())
        ray.kill(h)
    kind = "no-op actors (ray's ceiling)" if noop else "producer actors"
    return {"case": f"ray tasks -> {kind} ({tasks} tasks, {actors} actor(s), {per_call}/call, warm)",
            "messages": total,
            "seconds": round(seconds, 3), "msg_per_s": round(total / seconds)}


def bench_driver(client, n: int) -> dict:
    producer = client.producer(batch_size=PER_CALL, linger_ms=5, acks=1)
    values = [MESSAGE] * PER_CALL
    producer.send_batch("ray-app", values)
    producer.flush()
    calls = n // PER_CALL
    t0 = time.perf_counter()
    for _ in range(calls):
        producer.send_batch("ray-app", values)
    producer.flush()
    seconds = time.perf_counter() - t0
    producer.close()
    return {"case": "driver producer send_batch (in process)", "messages": calls * PER_CALL,
            "seconds": round(seconds, 3), "msg_per_s": round(calls * PER_CALL / seconds)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--per-call", type=int, nargs="+", default=[1000, 5000], help="messages per send_batch call")
    args = parser.parse_args(argv)

    import raylog

    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    with raylog.connect() as client:
        client.create_topic("ray-app", partitions=4)
        rows.append(bench_driver(client, args.messages))
        print(json.dumps(rows[-1]), flush=True)
        for per_call in args.per_call:
            for actors in args.actors:
                for noop in (True, False):
                    row = bench_actors(client, args.messages, args.tasks, actors, args.in_flight, per_call, noop)
                    if not noop:
                        row["vs_ceiling"] = round(row["msg_per_s"] / rows[-1]["msg_per_s"], 2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(json.dumps({"case": "load", "before": load_before, "after": load_after, "cpus": os.cpu_count()}))
    print()
    print(f"{'case':<84} {'messages':>10} {'seconds':>8} {'msg/s':>11} {'/driver':>8} {'/ceiling':>9}")
    for r in rows:
        ceiling = f"{r['vs_ceiling']:>9.2f}" if "vs_ceiling" in r else f"{'':>9}"
        print(f"{r['case']:<84} {r['messages']:>10,} {r['seconds']:>8.2f} {r['msg_per_s']:>11,} "
              f"{r['msg_per_s'] / rows[0]['msg_per_s']:>8.2f} {ceiling}")
    print("/ceiling: producer actors against no-op actors taking the same calls (the row above, same run)")
    print(f"load average (1/5/15 min) before {load_before}, after {load_after}; {os.cpu_count()} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
