"""The table view of a compacted topic (``client.read_table`` and
``raylog_spark.read_table``): the acceptance of issue 46 -- a compacted
topic of 1 M records over 10 k keys reads back as exactly 10 k latest
values, through Ray Data and through Spark.

Starts the embedded cluster (``raylog.connect()``: ZooKeeper and Ray on
this machine), creates a compacted topic of ``--partitions`` partitions
(small segments, the cleaner eager), produces ``--records`` records of
``--value-bytes`` over ``--keys`` keys (keyed: a key lives in one
partition), then measures the table view through each engine: ``ray``,
``client.read_table`` (one read task per partition, the dataset
materialized); ``spark``, ``raylog_spark.read_table`` (Spark's JVM reader,
one aggregation; a RayDP session of one executor, ``--spark-cores``
cores, started once, its start not measured), collected to the driver;

* ``uncleaned``: the same records in a topic of ``cleanup_policy="delete"``
  (no cleaner: the read deduplicates all the records itself, as on a
  compacted topic before its cleaner has run);
* ``cleaned``: the compacted topic once every partition's cleaner has
  rewritten its closed segments (the read skips the removed records' gaps);

and for each: the rows, whether they are exactly the latest value of each
key, the records a plain read (``read_raylog``) returns, and the seconds.

Output: one JSON line per measurement, then a short table of the table-view
rows (``--json-only``: the JSON lines alone). ``--no-spark``: Ray only.
Usage::

    python bench/read_table.py [--records 1000000] [--keys 10000] [--partitions 4] [--no-spark]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integrations", "spark"))


def produce(client, topic: str, records: int, keys: int, value_bytes: int) -> dict:
    """``records`` keyed records (record ``i``: key ``i mod keys``); the latest value of each key."""
    pad = b"." * max(0, value_bytes - 12)
    producer = client.producer(acks=1)
    latest = {}
    try:
        step = 10_000
        for first in range(0, records, step):
            n = min(step, records - first)
            ks = [b"key-%d" % ((first + i) % keys) for i in range(n)]
            vs = [b"%011d" % (first + i) + pad for i in range(n)]
            producer.send_batch(topic, vs, ks)
            latest.update(zip(ks, vs))
        producer.flush()
    finally:
        producer.close()
    return latest


def measure(client, topic: str, latest: dict, stage: str) -> dict:
    from raylog.read import read_raylog

    records = read_raylog(topic, client=client).count()
    t0 = time.perf_counter()
    table = client.read_table(topic).materialize()
    rows = table.take_all()
    seconds = time.perf_counter() - t0
    got = {r["key"]: r["value"] for r in rows}
    return {"bench": "read_table", "engine": "ray", "stage": stage, "rows": len(rows), "keys": len(got),
            "exactly_latest": got == latest and len(rows) == len(latest),
            "records_in_log": records, "seconds": round(seconds, 3)}


def measure_spark(spark, client, topic: str, latest: dict, stage: str) -> dict:
    import raylog_spark

    records = raylog_spark.read_topic(spark, topic, client=client).count()  # COUNT pushed down
    t0 = time.perf_counter()
    rows = raylog_spark.read_table(spark, topic, client=client).select("key", "value").collect()
    seconds = time.perf_counter() - t0
    got = {bytes(r["key"]): bytes(r["value"]) for r in rows}
    return {"bench": "read_table", "engine": "spark", "stage": stage, "rows": len(rows), "keys": len(got),
            "exactly_latest": got == latest and len(rows) == len(latest),
            "records_in_log": records, "seconds": round(seconds, 3)}


def print_table(rows: list[dict]) -> None:
    """The table-view measurements as a short text table."""
    print(f"{'engine':<7} {'stage':<10} {'records read':>12} {'rows':>7} {'exact':>6} {'seconds':>8}")
    for r in rows:
        print(f"{r['engine']:<7} {r['stage']:<10} {r['records_in_log']:>12} {r['rows']:>7} "
              f"{str(r['exactly_latest']):>6} {r['seconds']:>8}")


def cleaned(client, topic: str, partitions: int) -> bool:
    return all(any(n.endswith(".index") for n in os.listdir(client.log_dir(topic, p))) for p in range(partitions))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--clean-timeout-s", type=float, default=600)
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--no-spark", action="store_true", help="measure client.read_table only")
    parser.add_argument("--spark-cores", type=int, default=2)
    args = parser.parse_args(argv)

    import raylog

    measured: list[dict] = []

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        if "engine" in row and "rows" in row:
            measured.append(row)

    client = raylog.connect(num_cpus=max(2, args.partitions) + (0 if args.no_spark else args.spark_cores))
    spark = None
    try:
        if not args.no_spark:
            import raylog_spark

            spark = raylog_spark.init_spark(app_name="bench-read-table", num_executors=1,
                                            executor_cores=args.spark_cores, executor_memory="1G")
        plain, topic = "bench-table-plain", "bench-table"
        client.create_topic(plain, partitions=args.partitions, segment_bytes=4 << 20)
        client.create_topic(topic, partitions=args.partitions, cleanup_policy="compact", segment_bytes=4 << 20,
                            min_cleanable_dirty_ratio=0.01, retention_check_ms=500)
        for name in (plain, topic):
            t0 = time.perf_counter()
            latest = produce(client, name, args.records, args.keys, args.value_bytes)
            emit({"bench": "produce", "topic": name, "records": args.records, "keys": args.keys,
                  "seconds": round(time.perf_counter() - t0, 3)})
        emit(measure(client, plain, latest, "uncleaned"))
        if spark is not None:
            emit(measure_spark(spark, client, plain, latest, "uncleaned"))
        deadline = time.monotonic() + args.clean_timeout_s
        while not cleaned(client, topic, args.partitions):
            if time.monotonic() > deadline:
                emit({"bench": "read_table", "stage": "cleaned", "error": "the cleaners did not run in time"})
                return 1
            time.sleep(1)
        time.sleep(5)  # let the passes under way finish
        emit(measure(client, topic, latest, "cleaned"))
        if spark is not None:
            emit(measure_spark(spark, client, topic, latest, "cleaned"))
        if not args.json_only:
            print_table(measured)
        return 0 if all(r["exactly_latest"] for r in measured) else 1
    finally:
        if spark is not None:
            raylog_spark.stop_spark()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
