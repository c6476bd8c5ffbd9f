"""The end-to-end demo behind ``make demo`` (also ``python -m raylog.demo``).

It starts the embedded default (local Ray, a ZooKeeper of its own, logs in
a temporary directory), creates a ``page_views`` topic, has several Ray
tasks produce page-view events through one producer actor, reads them all
back with a consumer, prints a summary and shuts everything down.
"""

from __future__ import annotations

import argparse
import collections
import json
import time


def _events(task: int, count: int) -> tuple[list[bytes], list[bytes]]:
    pages = ["/", "/search", "/item", "/cart", "/checkout"]
    values, keys = [], []
    for i in range(count):
        user = f"user-{(task * 7919 + i) % 1000}"
        event = {"user": user, "page": pages[(i + task) % len(pages)], "task": task, "seq": i}
        values.append(json.dumps(event, separators=(",", ":")).encode())
        keys.append(user.encode())
    return values, keys


def run(tasks: int = 4, events_per_task: int = 25_000, partitions: int = 4) -> dict:
    import ray
    from tqdm import tqdm

    import raylog

    started = time.time()
    print("starting the embedded cluster (local Ray + ZooKeeper) ...", flush=True)
    with raylog.connect() as client:
        client.create_topic("page_views", partitions=partitions)
        print(f"topic page_views: {partitions} partitions on {client.data_dir}", flush=True)

        producer = client.producer_actor(batch_size=200, linger_ms=5, acks=1)

        @ray.remote(num_cpus=0)
        def produce(task: int) -> int:
            values, keys = _events(task, events_per_task)
            for start in range(0, len(values), 5_000):
                ray.get(producer.send_batch.remote("page_views", values[start : start + 5_000], keys[start : start + 5_000]))
            return len(values)

        t0 = time.time()
        produced = sum(ray.get([produce.remote(t) for t in range(tasks)]))
        ray.get(producer.flush.remote())
        produce_s = time.time() - t0
        print(f"produced {produced:,} events from {tasks} Ray tasks in {produce_s:.2f} s", flush=True)

        consumer = client.consumer("page_views", auto_offset_reset="earliest")
        per_partition = collections.Counter()
        pages = collections.Counter()
        t0 = time.time()
        with tqdm(total=produced, unit="msg", desc="consuming", leave=False) as bar:
            received = 0
            while received < produced:
                batch = consumer.poll(timeout_ms=5_000)
                if not batch:
                    raise RuntimeError(f"no data for 5 s after {received} of {produced} events")
                for msg in batch:
                    per_partition[msg.partition] += 1
                    pages[json.loads(msg.value)["page"]] += 1
                received += len(batch)
                bar.update(len(batch))
        consume_s = time.time() - t0
        consumer.close()
        ray.get(producer.close.remote())

        summary = {
            "messages": received,
            "partitions": dict(sorted(per_partition.items())),
            "produce_msg_per_s": round(produced / produce_s),
            "consume_msg_per_s": round(received / consume_s),
            "pages": dict(pages.most_common()),
        }
        print()
        print(f"  messages          {received:,}")
        print(f"  per partition     {', '.join(f'{p}: {n:,}' for p, n in sorted(per_partition.items()))}")
        print(f"  produce           {summary['produce_msg_per_s']:,} msg/s (Ray tasks -> producer actor -> partitions)")
        print(f"  consume           {summary['consume_msg_per_s']:,} msg/s (sendfile -> consumer)")
        print(f"  top pages         {', '.join(f'{p} {n:,}' for p, n in pages.most_common(3))}")
        print()
    print(f"done in {time.time() - started:.1f} s; cluster stopped.")
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="raylog end-to-end demo on an embedded local cluster")
    parser.add_argument("--tasks", type=int, default=4, help="Ray tasks producing events")
    parser.add_argument("--events-per-task", type=int, default=25_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args(argv)
    run(args.tasks, args.events_per_task, args.partitions)


if __name__ == "__main__":
    main()
