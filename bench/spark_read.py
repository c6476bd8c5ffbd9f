"""Spark reading a topic (``raylog_spark.read_topic``) beside Spark reading the
same rows from a local Parquet file, in the same run and the same session.

Starts the embedded cluster (``raylog.connect()``) and one Spark session
through RayDP, produces N 200-byte messages over P partitions (random
bytes, no two alike), writes the rows that ``read_topic`` returns to a
Parquet file, then times, each case
``--repeat`` rounds after a warm-up round, each round running every case
once (so that all cases see the same load; best and median reported):

* ``count``: ``read_topic(...).count()`` vs ``spark.read.parquet(...).count()``.
  Parquet answers a count from its footers without reading a row; raylog's
  count is pushed down to the partition actors (COUNT: each walks its range
  on its node, checking every message's CRC32C, and sends only the number).
  ``raylog-jvm-read`` is the same count with the push-down off
  (``count_pushdown=False``: every message fetched and checked in Spark);
* ``scan``: ``agg(sum(length(value)))``, which makes both read every value;
* ``avro``: M Avro records (Confluent framing, a registered schema) read as
  typed columns (``value_format="avro"``) and aggregated over every column
  (count, sums of ``id``, ``amount`` and the strings' lengths, the latest
  ``at``), vs the same typed rows from Parquet.

``count`` and ``scan`` run with both engines of ``read_topic``: ``jvm`` (the
Spark data source in the executors' JVMs) and ``python`` (``mapInArrow``),
and by name (``byname``: ``spark.read.format("raylog")``, planned in the JVM).

* ``stream``: ``spark.readStream.format("raylog")`` with
  ``Trigger.AvailableNow`` from ``earliest`` into Spark's ``noop`` sink (a
  fresh checkpoint each round; rows counted from the query's progress) vs
  the batch read by name of the same data into the same sink.
``avro`` runs with both engines: ``jvm`` (values decoded in the executors'
JVMs, what ``read_topic`` does by default) and ``python`` (fastavro in
Python workers).

* ``catchup`` (with ``--catchup N``): a streaming catch-up of a backlog of
  N messages (topic ``bench-catchup``) with ``maxOffsetsPerTrigger``
  (``--max-offsets-per-trigger``, N/10 by default) and
  ``Trigger.AvailableNow``, so the query runs N/M micro-batches, vs one
  batch read of the same records into the same ``noop`` sink. Each trigger
  asks the partitions for their backlogs in records and for where each
  share ends (COUNT); the partitions answer from their segments' record
  counts, so the time of that stays small as N grows (a walk of the whole
  backlog per trigger made it quadratic). Beside it, the same rows as
  Parquet files read by Spark's own file source one file per micro-batch,
  vs one batch read of them: what Spark's micro-batches cost by themselves.
  ``--catchup-repeat`` rounds (3).

Every read of the topic plans again (offsets, endpoints), as a user's would.
Prints one JSON line per measurement, then a table with rows/s and the
raylog/Parquet ratios.

    python bench/spark_read.py                       # N = 1,000,000 over 4 partitions
    python bench/spark_read.py -n 200000 --avro 100000 --json-only
    python bench/spark_read.py --only-catchup --catchup 10000000   # 10 M records, 1 M per trigger
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shutil
import statistics
import tempfile
import time

VALUE_BYTES = 200
AVRO_SCHEMA = {
    "type": "record",
    "name": "PageView",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def _emit(rows: list, row: dict, json_only: bool) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def empty_reader(batches):
    """A mapInArrow function that reads nothing: the Spark floor."""
    for _batch in batches:
        pass
    return iter(())


ENGINES = ("jvm", "python")


def produce_plain(client, topic: str, n: int) -> float:
    producer = client.producer(batch_size=1000, linger_ms=5, acks=1, max_buffered_messages=200_000)
    # every value its own random bytes: incompressible, and no value repeats
    # (a cycle of a few values would let Parquet store a dictionary and indices)
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        count = min(1000, n - start)
        block = os.urandom(VALUE_BYTES * count)
        producer.send_batch(topic, [block[i * VALUE_BYTES:(i + 1) * VALUE_BYTES] for i in range(count)])
    producer.flush()
    producer.close()
    return time.perf_counter() - t0


def produce_avro(client, topic: str, n: int) -> float:
    from raylog.avro import AvroSerializer
    from raylog.zk.schemas import SchemaRegistry

    serializer = AvroSerializer(SchemaRegistry(client.metadata.zk, client.settings.cluster), AVRO_SCHEMA)
    producer = client.producer(batch_size=1000, linger_ms=5, acks=1, max_buffered_messages=200_000)
    pages = ["/", "/search", "/item", "/cart", "/checkout"]
    base_ms = 1_700_000_000_000
    t0 = time.perf_counter()
    batch = []
    for i in range(n):
        record = {
            "id": i,
            "user": f"user-{i % 1000}",
            "page": pages[i % len(pages)],
            "amount": (i % 1000) / 10.0,
            "at": datetime.datetime.fromtimestamp((base_ms + i) / 1000, tz=datetime.timezone.utc),
        }
        batch.append(serializer.serialize(record))
        if len(batch) == 1000:
            producer.send_batch(topic, batch)
            batch = []
    if batch:
        producer.send_batch(topic, batch)
    producer.flush()
    producer.close()
    return time.perf_counter() - t0


def _available_now(reader, checkpoint: str):
    """Run ``reader`` (a streaming DataFrame) into the ``noop`` sink with
    ``Trigger.AvailableNow``: ``(seconds, rows, micro-batches, summed durationMs)``."""
    t0 = time.perf_counter()
    query = (reader.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    durations: dict[str, int] = {}
    for p in progress:
        for key, ms in p["durationMs"].items():
            durations[key] = durations.get(key, 0) + ms
    return seconds, sum(p["numInputRows"] for p in progress), len(progress), durations


def run_catchup(spark, args, workdir: str, rows: list) -> None:
    """The ``catchup`` case: AvailableNow with maxOffsetsPerTrigger over the
    ``bench-catchup`` backlog vs one batch read of it; and the same rows as
    Parquet files read by Spark's own file source, one file per micro-batch
    (``maxFilesPerTrigger`` 1), vs one batch read of them: the cost of
    Spark's micro-batches themselves. Rounds alternate the four."""
    per_trigger = args.max_offsets_per_trigger or max(1, args.catchup // 10)
    by_name = lambda: spark.read.format("raylog").option("subscribe", "bench-catchup").load()  # noqa: E731
    files = os.path.join(workdir, "catchup.parquet")
    frame = by_name()
    frame.write.option("maxRecordsPerFile", per_trigger).parquet(files)
    schema = spark.read.parquet(files).schema
    runs: dict[str, list[float]] = {"stream": [], "batch": [], "files-stream": [], "files-batch": []}
    shape: dict[str, tuple] = {}
    for round_ in range(args.catchup_repeat + 1):
        timed = {}
        stream = (spark.readStream.format("raylog").option("subscribe", "bench-catchup")
                  .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", per_trigger).load())
        seconds, got, batches, durations = _available_now(stream, os.path.join(workdir, f"catchup-{round_}"))
        if got != args.catchup:
            raise RuntimeError(f"the catch-up read {got} rows, expected {args.catchup}")
        timed["stream"], shape["stream"] = seconds, (batches, durations)
        t0 = time.perf_counter()
        by_name().write.format("noop").mode("overwrite").save()
        timed["batch"] = time.perf_counter() - t0
        stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(files)
        seconds, got, batches, durations = _available_now(stream, os.path.join(workdir, f"files-{round_}"))
        if got != args.catchup:
            raise RuntimeError(f"the Parquet catch-up read {got} rows, expected {args.catchup}")
        timed["files-stream"], shape["files-stream"] = seconds, (batches, durations)
        t0 = time.perf_counter()
        spark.read.parquet(files).write.format("noop").mode("overwrite").save()
        timed["files-batch"] = time.perf_counter() - t0
        if round_:  # the first round warms up
            for key, seconds in timed.items():
                runs[key].append(seconds)
    best = {key: min(v) for key, v in runs.items()}
    for source, stream_key, batch_key in (("raylog", "stream", "batch"), ("parquet-files", "files-stream",
                                                                          "files-batch")):
        batches, durations = shape[stream_key]
        _emit(rows, {"case": "catchup", "source": source, "records": args.catchup,
                     "max_offsets_per_trigger": per_trigger, "micro_batches": batches,
                     "stream_seconds": round(best[stream_key], 3),
                     "stream_median_seconds": round(statistics.median(runs[stream_key]), 3),
                     "batch_seconds": round(best[batch_key], 3),
                     "batch_median_seconds": round(statistics.median(runs[batch_key]), 3),
                     "ratio_stream_to_batch_time": round(best[stream_key] / best[batch_key], 3),
                     "last_round_duration_ms": durations, "partitions": args.partitions},
              args.json_only)
    if not args.json_only:
        print()
        print(f"{'catch-up':<15}{'records':>12}{'batches':>9}{'stream s':>10}{'batch s':>9}{'ratio':>8}"
              f"{'latestOffset ms':>17}")
        for source, stream_key, batch_key in (("raylog", "stream", "batch"),
                                              ("parquet files", "files-stream", "files-batch")):
            batches, durations = shape[stream_key]
            print(f"{source:<15}{args.catchup:>12,}{batches:>9}{best[stream_key]:>10.2f}{best[batch_key]:>9.2f}"
                  f"{best[stream_key] / best[batch_key]:>8.2f}{durations.get('latestOffset', 0):>17,}")
        print("ratio: a stream's time over the batch read's of the same rows; latestOffset: summed over the")
        print("micro-batches of the last round (where raylog counts the backlogs and the trigger's ends)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=1_000_000)
    parser.add_argument("-p", "--partitions", type=int, default=4)
    parser.add_argument("--avro", type=int, default=200_000, help="Avro records for the typed read")
    # each job takes a few tenths of a second, a third of it Spark's own
    # fixed cost: with 3 rounds one noisy round decided a case's best
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--executor-cores", type=int, default=2)
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--catchup", type=int, default=0,
                        help="messages of the streaming catch-up case (0: not run)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0,
                        help="records per micro-batch of the catch-up (default: a tenth of --catchup)")
    parser.add_argument("--catchup-repeat", type=int, default=3)
    parser.add_argument("--only-catchup", action="store_true", help="run the catch-up case alone")
    args = parser.parse_args(argv)
    if args.only_catchup and not args.catchup:
        parser.error("--only-catchup needs --catchup N")

    import raylog
    import raylog_spark
    from pyspark.sql import functions as F

    rows: list[dict] = []
    workdir = tempfile.mkdtemp(prefix="raylog-bench-spark-")
    client = raylog.connect(num_cpus=max(4, args.executor_cores + 2))
    spark = None
    try:
        if args.catchup:
            client.create_topic("bench-catchup", partitions=args.partitions)
            seconds = produce_plain(client, "bench-catchup", args.catchup)
            _emit(rows, {"case": "produce catchup", "messages": args.catchup, "seconds": round(seconds, 3)},
                  args.json_only)
        if args.only_catchup:
            spark = raylog_spark.init_spark(app_name="raylog-bench-spark-read", num_executors=1,
                                            executor_cores=args.executor_cores, executor_memory="2G")
            run_catchup(spark, args, workdir, rows)
            return
        client.create_topic("bench", partitions=args.partitions)
        seconds = produce_plain(client, "bench", args.messages)
        _emit(rows, {"case": "produce", "messages": args.messages, "seconds": round(seconds, 3)}, args.json_only)
        if args.avro:
            client.create_topic("bench-avro", partitions=args.partitions)
            seconds = produce_avro(client, "bench-avro", args.avro)
            _emit(rows, {"case": "produce avro", "messages": args.avro, "seconds": round(seconds, 3)}, args.json_only)

        spark = raylog_spark.init_spark(
            app_name="raylog-bench-spark-read",
            num_executors=1,
            executor_cores=args.executor_cores,
            executor_memory="2G",
        )

        def topic(value_format="binary", name="bench", engine="auto", **options):
            return raylog_spark.read_topic(
                spark, name, value_format=value_format, client=client, engine=engine, **options
            )

        parquet = os.path.join(workdir, "bench.parquet")
        topic().write.parquet(parquet)
        scan = F.sum(F.length("value")).alias("bytes")
        cases = []
        for engine in ENGINES:
            cases.append(("count", f"raylog-{engine}", functools.partial(lambda e: topic(engine=e).count(), engine)))
        cases.append(("count", "raylog-jvm-read", lambda: topic(engine="jvm", count_pushdown=False).count()))
        cases.append(("count", "parquet", lambda: spark.read.parquet(parquet).count()))
        for engine in ENGINES:
            cases.append(
                ("scan", f"raylog-{engine}", functools.partial(lambda e: topic(engine=e).agg(scan).collect()[0][0], engine))
            )
        cases.append(("scan", "parquet", lambda: spark.read.parquet(parquet).agg(scan).collect()[0][0]))
        by_name = lambda: spark.read.format("raylog").option("subscribe", "bench").load()  # noqa: E731
        cases.insert(0, ("count", "raylog-byname", lambda: by_name().count()))
        cases.insert(len(ENGINES) + 3, ("scan", "raylog-byname", lambda: by_name().agg(scan).collect()[0][0]))
        checkpoints = iter(range(10**6))

        def stream_available_now():
            query = (
                spark.readStream.format("raylog")
                .option("subscribe", "bench")
                .option("startingOffsets", "earliest")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", os.path.join(workdir, f"ckpt-{next(checkpoints)}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            return sum(p["numInputRows"] for p in query.recentProgress)

        def batch_into_noop():
            by_name().write.format("noop").mode("overwrite").save()
            return args.messages  # the noop sink counts nothing; count/raylog-byname checks the same read

        cases.append(("stream", "raylog-availablenow", stream_available_now))
        cases.append(("stream", "raylog-batch", batch_into_noop))
        typed = [
            F.count("*").alias("rows"),
            F.sum("id").alias("ids"),
            F.sum(F.length("user") + F.length("page")).alias("chars"),
            F.sum("amount").alias("amount"),
            F.max("at").alias("latest"),
        ]
        if args.avro:
            avro_parquet = os.path.join(workdir, "bench-avro.parquet")
            topic("avro", "bench-avro").drop("key").write.parquet(avro_parquet)
            for engine in ENGINES:
                cases.append(
                    (
                        "avro",
                        f"raylog-{engine}",
                        functools.partial(
                            lambda e: topic("avro", "bench-avro", engine=e).agg(*typed).collect()[0][0], engine
                        ),
                    )
                )
            cases.append(("avro", "parquet", lambda: spark.read.parquet(avro_parquet).agg(*typed).collect()[0][0]))
        # Reference: a mapInArrow job over one empty range per partition, the
        # fixed cost of any Python reader in Spark 3.5 (tasks, Python workers).
        floor = lambda: spark.range(0, args.partitions, 1, args.partitions).mapInArrow(  # noqa: E731
            empty_reader, "n long"
        ).count()
        cases.append(("floor", "mapInArrow", floor))

        # Warm-up, then rounds that run every case once each, so that every
        # case sees the same load on the machine; best and median reported.
        times: dict[tuple[str, str], list[float]] = {(c, s): [] for c, s, _ in cases}
        for round_ in range(args.repeat + 1):
            for case, source, fn in cases:
                t0 = time.perf_counter()
                result = fn()
                seconds = time.perf_counter() - t0
                expected = {"avro": args.avro, "scan": args.messages * VALUE_BYTES, "floor": 0}.get(case, args.messages)
                if result != expected:
                    raise RuntimeError(f"{case} {source} returned {result}, expected {expected}")
                if round_:
                    times[(case, source)].append(seconds)
        results = {}
        for (case, source), runs in times.items():
            n = {"avro": args.avro, "floor": 0}.get(case, args.messages)
            best = min(runs)
            results[(case, source)] = n / best
            _emit(
                rows,
                {
                    "case": case,
                    "source": source,
                    "rows": n,
                    "seconds": round(best, 3),
                    "median_seconds": round(statistics.median(runs), 3),
                    "rows_per_s": round(n / best),
                    "partitions": args.partitions,
                    "executor_cores": args.executor_cores,
                },
                args.json_only,
            )
        sources = ("raylog-byname", "raylog-jvm", "raylog-jvm-read", "raylog-python")
        for case in ("count", "scan", "avro"):
            for source in sources:
                if (case, source) in results:
                    ratio = results[(case, source)] / results[(case, "parquet")]
                    _emit(
                        rows,
                        {"case": case, "source": source, "ratio_raylog_to_parquet": round(ratio, 3)},
                        args.json_only,
                    )
        _emit(
            rows,
            {
                "case": "stream",
                "source": "raylog-availablenow",
                "ratio_stream_to_batch": round(
                    results[("stream", "raylog-availablenow")] / results[("stream", "raylog-batch")], 3
                ),
            },
            args.json_only,
        )
        if not args.json_only:
            print()
            print(f"{'case':<7}{'source':<17}{'rows/s':>14}{'parquet rows/s':>16}{'ratio':>8}")
            for case in ("count", "scan", "avro"):
                for source in sources:
                    if (case, source) in results:
                        r, p = results[(case, source)], results[(case, "parquet")]
                        print(f"{case:<7}{source:<17}{r:>14,.0f}{p:>16,.0f}{r / p:>8.2f}")
            r, b = results[("stream", "raylog-availablenow")], results[("stream", "raylog-batch")]
            print(f"{'stream':<7}{'availableNow':<17}{r:>14,.0f}{'batch ' + format(b, ',.0f'):>16}{r / b:>8.2f}")
            print()
            print("count: Parquet answers from its footers (metadata); scan and avro read every row.")
        if args.catchup:
            run_catchup(spark, args, workdir, rows)
            print("avro: raylog-jvm is what read_topic(value_format='avro') runs by default.")
            print(
                f"floor: an empty mapInArrow job over {args.partitions} partitions took "
                f"{min(times[('floor', 'mapInArrow')]):.3f} s; raylog count "
                f"{min(times[('count', 'raylog-jvm')]):.3f} s (jvm), {min(times[('count', 'raylog-python')]):.3f} s "
                f"(python), Parquet count {min(times[('count', 'parquet')]):.3f} s."
            )
    finally:
        try:
            if spark is not None:
                raylog_spark.stop_spark()
        finally:
            client.close()
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
