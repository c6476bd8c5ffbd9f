"""The end-to-end demo behind ``make demo`` (also ``python -m raylog.tools.demo``).

It starts the embedded default (local Ray, a ZooKeeper of its own, logs in
a temporary directory), creates a ``page_views`` topic, has several Ray
tasks produce page-view events through one producer actor, reads them all
back with a consumer group of three members that share the partitions,
prints a summary with the group's committed offsets and lag, checks the
audit counts (produced vs consumed per window), then starts Spark on the
same Ray cluster (RayDP), reads the events as a DataFrame
(``raylog_spark.read_topic``, JSON values parsed), prints views and users
per page, and shuts everything down.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import raylog
import raylog_spark
from raylog.errors import RaylogError

#: events per ``send_batch`` call of a producing task, and how many of its
#: calls may await their acks at once (the producer actor batches them
#: together across tasks)
SEND_BATCH = 5_000
SEND_IN_FLIGHT = 4


def _events(task: int, count: int) -> tuple[list[bytes], list[bytes]]:
    pages = ["/", "/search", "/item", "/cart", "/checkout"]
    values, keys = [], []
    for i in range(count):
        user = f"user-{(task * 7919 + i) % 1000}"
        event = {"user": user, "page": pages[(i + task) % len(pages)], "task": task, "seq": i}
        values.append(json.dumps(event, separators=(",", ":")).encode())
        keys.append(user.encode())
    return values, keys


def _spark_step(client, produced: int) -> dict:
    """The events read back as a Spark DataFrame (Spark on the same Ray
    cluster through RayDP), their JSON values parsed, views per page."""
    from pyspark.sql import functions as F  # heavy (Spark): imported when used

    print("starting Spark on the same Ray cluster (RayDP) ...", flush=True)
    spark = raylog_spark.init_spark(app_name="raylog-demo", num_executors=1, executor_cores=1, executor_memory="1G")
    try:
        t0 = time.time()
        events = raylog_spark.read_topic(
            spark, "page_views", value_format="json", schema="user STRING, page STRING, task INT, seq INT", client=client
        )
        pages = (
            events.groupBy("page")
            .agg(F.count("*").alias("views"), F.countDistinct("user").alias("users"))
            .orderBy(F.desc("views"), "page")
            .collect()
        )
        read_s = time.time() - t0
        total = sum(row["views"] for row in pages)
        plan = events.raylog_plan
        print()
        print(
            f"  Spark: read_topic('page_views') -> {len(plan.ranges)} ranges, {plan.total_bytes / 1e6:.1f} MB, "
            f"{total:,} events" + ("" if total == produced else f" (expected {produced:,}!)")
        )
        print(f"  {'page':<12}{'views':>10}{'users':>8}")
        for row in pages:
            print(f"  {row['page']:<12}{row['views']:>10,}{row['users']:>8,}")
        print(f"  (read, parsed and aggregated in {read_s:.1f} s)")
        print()
        return {"events": total, "views": {row["page"]: row["views"] for row in pages}}
    finally:
        raylog_spark.stop_spark()


def run(
    tasks: int = 4, events_per_task: int = 25_000, partitions: int = 6, consumers: int = 3, spark: bool = True
) -> dict:
    import ray  # heavy (Ray): imported when used
    from tqdm import tqdm  # optional: imported when used

    started = time.time()
    print("starting the embedded cluster (local Ray + ZooKeeper) ...", flush=True)
    with raylog.connect() as client:
        client.create_topic("page_views", partitions=partitions)
        print(f"topic page_views: {partitions} partitions on {client.data_dir}", flush=True)

        producer = client.producer_actor(batch_size=200, linger_ms=5, acks=1, audit=True)

        @ray.remote(num_cpus=0)
        def produce(task: int) -> int:
            values, keys = _events(task, events_per_task)
            in_flight = []  # at most SEND_IN_FLIGHT calls, each resolved when its messages are acked
            for start in range(0, len(values), SEND_BATCH):
                if len(in_flight) >= SEND_IN_FLIGHT:
                    done, in_flight = ray.wait(in_flight, num_returns=1)
                    ray.get(done)  # raises what the call ran into
                end = start + SEND_BATCH
                in_flight.append(producer.send_batch.remote("page_views", values[start:end], keys[start:end]))
            ray.get(in_flight)
            return len(values)

        t0 = time.time()
        produced = sum(ray.get([produce.remote(t) for t in range(tasks)]))
        ray.get(producer.flush.remote())
        produce_s = time.time() - t0
        print(f"produced {produced:,} events from {tasks} Ray tasks in {produce_s:.2f} s", flush=True)

        # A consumer group of three members shares the partitions.
        members = [
            client.consumer(
                "page_views", group="page-stats", auto_offset_reset="earliest", session_timeout_ms=6000, audit=True
            )
            for _ in range(consumers)
        ]
        per_partition = collections.Counter()
        per_member = collections.Counter()
        pages = collections.Counter()
        t0 = time.time()
        with tqdm(
            total=produced, unit="msg", desc="consuming (group page-stats)", leave=False, disable=not sys.stderr.isatty()
        ) as bar:
            received = 0
            idle_since = time.time()
            while received < produced:
                got = 0
                for i, member in enumerate(members):
                    batch = member.poll(timeout_ms=100)
                    for msg in batch:
                        per_partition[msg.partition] += 1
                        pages[json.loads(msg.value)["page"]] += 1
                    per_member[i] += len(batch)
                    got += len(batch)
                received += got
                bar.update(got)
                if got:
                    idle_since = time.time()
                elif time.time() - idle_since > 30:
                    raise RuntimeError(f"no data for 30 s after {received} of {produced} events")
        consume_s = time.time() - t0
        for member in members:
            member.commit()
        lag = client.describe_group("page-stats")
        for member in members:
            member.close()  # publishes the members' last audit counts
        ray.get(producer.close.remote())
        audit = client.audit(topic="page_views", group="page-stats")

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
        print("  group page-stats after commit:")
        print(f"  {'partition':>9} {'owner':<28} {'committed':>10} {'end':>10} {'lag (bytes)':>12}")
        for row in lag:
            if row.get("partition") is None:
                continue
            print(
                f"  {row['partition']:>9} {str(row['owner'])[:28]:<28} {row['committed']:>10} "
                f"{row['end_offset']:>10} {row['lag_bytes']:>12}"
            )
        print(f"  messages per member: {', '.join(f'#{i}: {n:,}' for i, n in sorted(per_member.items()))}")
        print()
        short = [row for row in audit if row["short"]]
        produced_total = sum(row["produced"] for row in audit)
        consumed_total = sum(row["consumed"]["page-stats"] for row in audit)
        print(
            f"  audit: {len(audit)} window(s), produced {produced_total:,}, consumed by page-stats "
            f"{consumed_total:,}: " + ("nothing lost" if not short else f"{len(short)} window(s) SHORT")
        )
        print()
        if spark:
            summary["spark"] = _spark_step(client, produced)
    stopped = not ray.is_initialized()
    print(f"done in {time.time() - started:.1f} s; " + ("cluster stopped." if stopped else "Ray still runs!"))
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="raylog end-to-end demo on an embedded local cluster")
    parser.add_argument("--tasks", type=int, default=4, help="Ray tasks producing events")
    parser.add_argument("--events-per-task", type=int, default=25_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--consumers", type=int, default=3, help="members of the consumer group")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark step")
    args = parser.parse_args(argv)

    try:
        run(args.tasks, args.events_per_task, args.partitions, args.consumers, spark=not args.no_spark)
    except KeyboardInterrupt:
        print("interrupted; cluster stopped.", file=sys.stderr)
        raise SystemExit(130) from None
    except RaylogError as err:  # one line, as the command line prints it
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
