"""Kafka clients through raylog's Kafka front door, beside raylog's own client.

One embedded cluster (``raylog.connect()``: a ZooKeeper and a local Ray of
its own, stopped at the end), its Kafka listeners
(``client.start_kafka_listeners()``), two topics of one partition, and in
the same run, ``-n`` messages of ``--size`` bytes each way:

* **produce**: raylog's producer with ``send_batch`` of 50 (``batch_size``
  50, acks 1) beside a confluent-kafka (librdkafka) producer with
  ``client.kafka_config()``, acks 1, ``linger.ms`` 5, ``batch.num.messages``
  50 (the same batch), each timed from the first send until every message
  is acknowledged; and for the same per-message calls on both sides,
  raylog's ``send`` of one message at a time (batch 50, acks 1), and the
  confluent-kafka producer's own ceiling: its ``produce`` + ``poll(0)``
  loop into a producer whose broker does not answer (``127.0.0.1:1``: the
  messages are queued and purged, nothing is sent), which no broker can beat;
* **consume**: raylog's consumer (``poll``: a message object each, as a
  Kafka client hands out; the ratio is to this) beside a confluent-kafka
  consumer (assigned the partition from offset 0, ``consume`` of up to
  10,000, ``fetch.queue.backoff.ms`` 10), each reading the topic its side
  produced from the start; and raylog's ``poll_batch`` (views of the
  fetched sets) and raylog's ``poll`` of the topic the Kafka producer
  wrote (its batches are stored as compressed wrappers, docs/design.md
  section 10) for reference; and the confluent-kafka consumer's own
  ceiling: ``consume`` of messages librdkafka already holds (fetched
  before the clock starts), which no broker can beat. librdkafka (2.4 and later) stops fetching
  for ``fetch.queue.backoff.ms`` (1,000 by default) whenever its queue holds
  ``queued.min.messages`` (100,000): with the default, a consumer that reads
  slower than the broker answers idles most of each second, against any
  broker, so the benchmark sets it to 10 ms as a throughput-minded
  application would.

The confluent-kafka consumer's case also reports the CPU the Kafka
listeners' processes spent serving it (user + system time from
``/proc/<pid>/stat``, the pids from each listener actor's ``stats()``),
as ``listener_cpu_s`` and ``listener_cpu_s_per_gb`` of values fetched
(messages x ``--size``: the same figure whatever the stored format; the
topic's stored bytes are reported beside it): the front door's own cost,
apart from the partition's and the client's. The partition's own, for the
same case (its actor's process: the data server that answers the
listener's LOCATE and FETCH requests), is reported beside it as
``partition_cpu_s`` and ``partition_cpu_s_per_gb``.

Prints one JSON line per case, then a table with the front door's ratio to
raylog's own client (issue: at least 0.5 each way). The machine may be
shared: the ratios, measured side by side, are what to read.

    python bench/kafka_clients.py                 # 200,000 messages of 100 bytes
    python bench/kafka_clients.py -n 50000 --json-only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _cpu_seconds(pids) -> float:
    """User + system CPU seconds of the processes ``pids`` so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / tick


def _listener_pids(client, entries) -> list[int]:
    """The pids of the listener actors of ``entries`` (this machine's)."""
    import ray

    from raylog.config import NAMESPACE
    from raylog.kafka.service import listener_name

    actors = [ray.get_actor(listener_name(client.settings.cluster, e["node"]), namespace=NAMESPACE)
              for e in entries]
    return sorted({stats["pid"] for stats in ray.get([a.stats.remote() for a in actors])})


def _partition_pid(client, topic: str) -> int:
    """The pid of the process that serves ``topic``-0 (its partition actor)."""
    import ray

    return ray.get(client.partition_actor(topic, 0).pid.remote())


def _emit(rows: list, row: dict, json_only: bool) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def raylog_produce(client, topic: str, n: int, value: bytes) -> dict:
    producer = client.producer(batch_size=50, linger_ms=5, acks=1, max_buffered_messages=200_000)
    values = [value] * 50
    futures = []
    t0 = time.perf_counter()
    for _ in range(n // 50):
        futures.append(producer.send_batch(topic, values, partition=0))
    producer.flush()
    for f in futures:
        f.result(timeout_s=120)
    seconds = time.perf_counter() - t0
    producer.close()
    return {"case": "raylog producer, send_batch of 50, acks 1", "messages": (n // 50) * 50,
            "seconds": round(seconds, 3), "msg_per_s": round((n // 50) * 50 / seconds)}


def kafka_produce(config: dict, topic: str, n: int, value: bytes) -> dict:
    import confluent_kafka

    producer = confluent_kafka.Producer({**config, "acks": "1", "linger.ms": 5, "batch.num.messages": 50,
                                         "queue.buffering.max.messages": 1_000_000})
    failed = []

    def delivered(err, _msg):
        if err is not None:
            failed.append(err)

    n = (n // 50) * 50
    t0 = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                producer.produce(topic, value, partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(120)
    seconds = time.perf_counter() - t0
    if left or failed:
        raise RuntimeError(f"confluent-kafka: {left} messages not delivered, {len(failed)} failed "
                           f"(first: {failed[0] if failed else None})")
    return {"case": "confluent-kafka producer via the front door, batch 50, acks 1", "messages": n,
            "seconds": round(seconds, 3), "msg_per_s": round(n / seconds)}


def raylog_produce_each(client, topic: str, n: int, value: bytes) -> dict:
    """raylog's producer with ``send`` of one message a call (batch 50,
    acks 1): the calls a confluent-kafka application makes."""
    producer = client.producer(batch_size=50, linger_ms=5, acks=1, max_buffered_messages=200_000)
    send = producer.send
    t0 = time.perf_counter()
    for _ in range(n):
        send(topic, value, partition=0)
    producer.flush()
    seconds = time.perf_counter() - t0
    producer.close()
    return {"case": "raylog producer, send of one message, batch 50, acks 1", "messages": n,
            "seconds": round(seconds, 3), "msg_per_s": round(n / seconds)}


def kafka_produce_ceiling(n: int, value: bytes) -> dict:
    """The confluent-kafka producer's own ceiling: :func:`kafka_produce`'s
    ``produce`` + ``poll(0)`` loop with the same settings into a producer
    whose broker (``127.0.0.1:1``) refuses connections, so every message
    stays queued (then purged): what the client's own calls cost."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": "127.0.0.1:1", "acks": "1", "linger.ms": 5,
                                         "batch.num.messages": 50, "queue.buffering.max.messages": 1_000_000,
                                         "log_level": 0})
    n = min((n // 50) * 50, 1_000_000)
    t0 = time.perf_counter()
    for _ in range(n):
        producer.produce("ceiling", value, partition=0)
        producer.poll(0)
    seconds = time.perf_counter() - t0
    producer.purge()
    producer.flush(0)
    return {"case": "confluent-kafka producer's own ceiling (queued, no broker)", "messages": n,
            "seconds": round(seconds, 3), "msg_per_s": round(n / seconds)}


def raylog_consume(client, topic: str, n: int, batches: bool) -> dict:
    """``poll`` (a message object each, as a Kafka client gives) or ``poll_batch`` (views)."""
    consumer = client.consumer(topic, auto_offset_reset="earliest", fetch_max_bytes=1 << 20)
    poll = consumer.poll_batch if batches else consumer.poll
    received = 0
    t0 = time.perf_counter()
    while received < n:
        got = poll(timeout_ms=10_000, max_messages=min(100_000, n - received))
        if not got:
            raise RuntimeError(f"raylog consumer stalled after {received} of {n} messages")
        received += sum(map(len, got)) if batches else len(got)
    seconds = time.perf_counter() - t0
    consumer.close()
    return {"case": f"raylog consumer, {'poll_batch' if batches else 'poll'}", "messages": received,
            "seconds": round(seconds, 3), "msg_per_s": round(received / seconds)}


def kafka_consume(config: dict, topic: str, n: int) -> dict:
    import confluent_kafka

    consumer = confluent_kafka.Consumer({**config, "group.id": f"bench-{os.getpid()}",
                                         "enable.auto.commit": False, "fetch.max.bytes": 1 << 20,
                                         "fetch.queue.backoff.ms": 10})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    received = 0
    t0 = time.perf_counter()
    while received < n:
        got = consumer.consume(num_messages=min(10_000, n - received), timeout=10.0)
        if not got:
            raise RuntimeError(f"confluent-kafka consumer stalled after {received} of {n} messages")
        errors = [m.error() for m in got if m.error() is not None]
        if errors:
            raise RuntimeError(f"confluent-kafka consumer: {errors[0]}")
        received += len(got)
    seconds = time.perf_counter() - t0
    consumer.close()
    return {"case": "confluent-kafka consumer via the front door", "messages": received,
            "seconds": round(seconds, 3), "msg_per_s": round(received / seconds)}


def kafka_consume_prefetched(config: dict, topic: str, n: int) -> dict:
    """The confluent-kafka consumer's own ceiling on this machine: ``consume``
    of messages librdkafka has already fetched into its queue (it is given
    a queue that holds them all and :data:`PREFETCH_S` to fill it), so no
    broker is waited for while timed."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({**config, "group.id": f"bench-{os.getpid()}-prefetched",
                                         "enable.auto.commit": False, "fetch.max.bytes": 1 << 20,
                                         "queued.min.messages": n, "queued.max.messages.kbytes": 2_097_151})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    if not consumer.consume(num_messages=1, timeout=10.0):
        raise RuntimeError("confluent-kafka consumer read nothing")
    time.sleep(PREFETCH_S)
    received, want = 1, n
    t0 = time.perf_counter()
    while received < want:
        got = consumer.consume(num_messages=min(10_000, want - received), timeout=10.0)
        if not got:
            raise RuntimeError(f"confluent-kafka consumer stalled after {received} of {want} messages")
        received += len(got)
    seconds = time.perf_counter() - t0
    consumer.close()
    return {"case": "confluent-kafka consumer, messages already fetched (the client's ceiling)",
            "messages": received - 1, "seconds": round(seconds, 3), "msg_per_s": round((received - 1) / seconds)}


def _with_listener_cpu(client, pids, topic: str, value_bytes: int, case) -> dict:
    """``case()``'s row with the listeners' CPU seconds spent while it ran,
    and the partition's (its actor's process), in all and per GB of values
    read (``value_bytes``)."""
    partition = [_partition_pid(client, topic)]
    before, partition_before = _cpu_seconds(pids), _cpu_seconds(partition)
    row = case()
    cpu, partition_cpu = _cpu_seconds(pids) - before, _cpu_seconds(partition) - partition_before
    start, end = client.offsets(topic, 0)
    gb = value_bytes / 1e9
    return {**row, "listener_cpu_s": round(cpu, 3), "value_bytes": value_bytes, "stored_bytes": end - start,
            "listener_cpu_s_per_gb": round(cpu / gb, 2) if value_bytes else None,
            "partition_cpu_s": round(partition_cpu, 3),
            "partition_cpu_s_per_gb": round(partition_cpu / gb, 2) if value_bytes else None}


#: how long the prefetched case lets librdkafka fill its queue before it is timed
PREFETCH_S = 5.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if args.messages < 50 or args.size < 0:
        parser.error("--messages must be at least 50 and --size not negative")

    import raylog

    value = b"x" * args.size
    rows: list = []
    load_before = os.getloadavg()[0]
    with raylog.connect(num_cpus=2) as client:
        listener_pids = _listener_pids(client, client.start_kafka_listeners())
        config = client.kafka_config()
        for topic in ("bench-raylog", "bench-kafka", "bench-raylog-each"):
            client.create_topic(topic, partitions=1)
        # a few messages first on each side: connections and actors warm
        _emit(rows, {**raylog_produce(client, "bench-raylog", 500, value), "warm_up": True}, args.json_only)
        _emit(rows, {**kafka_produce(config, "bench-kafka", 500, value), "warm_up": True}, args.json_only)
        produced = {"raylog": raylog_produce(client, "bench-raylog", args.messages, value),
                    "kafka": kafka_produce(config, "bench-kafka", args.messages, value),
                    "raylog_each": raylog_produce_each(client, "bench-raylog-each", args.messages, value),
                    "kafka_ceiling": kafka_produce_ceiling(args.messages, value)}
        for row in produced.values():
            _emit(rows, row, args.json_only)
        total = 500 + (args.messages // 50) * 50
        consumed = {"raylog": raylog_consume(client, "bench-raylog", total, batches=False),
                    "kafka": _with_listener_cpu(client, listener_pids, "bench-kafka", total * args.size,
                                                lambda: kafka_consume(config, "bench-kafka", total)),
                    "raylog_batch": raylog_consume(client, "bench-raylog", total, batches=True),
                    "raylog_of_kafka": {**raylog_consume(client, "bench-kafka", total, batches=False),
                                        "case": "raylog consumer, poll, of the Kafka producer's topic"},
                    "kafka_prefetched": kafka_consume_prefetched(config, "bench-kafka", total)}
        for row in consumed.values():
            _emit(rows, row, args.json_only)
    summary = {"produce_ratio": round(produced["kafka"]["msg_per_s"] / produced["raylog"]["msg_per_s"], 3),
               "produce_ratio_per_message": round(produced["kafka"]["msg_per_s"]
                                                  / produced["raylog_each"]["msg_per_s"], 3),
               "produce_of_client_ceiling": round(produced["kafka"]["msg_per_s"]
                                                  / produced["kafka_ceiling"]["msg_per_s"], 3),
               "consume_ratio": round(consumed["kafka"]["msg_per_s"] / consumed["raylog"]["msg_per_s"], 3),
               "consume_of_client_ceiling": round(consumed["kafka"]["msg_per_s"]
                                                  / consumed["kafka_prefetched"]["msg_per_s"], 3),
               "listener_cpu_s_per_gb_fetched": consumed["kafka"]["listener_cpu_s_per_gb"],
               "partition_cpu_s_per_gb_fetched": consumed["kafka"]["partition_cpu_s_per_gb"],
               "messages": args.messages, "size": args.size, "loadavg_before": round(load_before, 2),
               "loadavg_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    _emit(rows, summary, args.json_only)
    if not args.json_only:
        print()
        print(f"{'case':<66} {'msg/s':>12}")
        for row in rows:
            if "case" in row and not row.get("warm_up"):
                print(f"{row['case']:<66} {row['msg_per_s']:>12,}")
        print(f"produce through the front door / raylog's send of one message "
              f"{summary['produce_ratio_per_message']}, / the client's own ceiling "
              f"{summary['produce_of_client_ceiling']}")
        print(f"front door / raylog's own client: produce {summary['produce_ratio']}, consume "
              f"{summary['consume_ratio']} (issue: at least 0.5 each); consume through the front door / the "
              f"client's own ceiling {summary['consume_of_client_ceiling']}; listener CPU "
              f"{summary['listener_cpu_s_per_gb_fetched']} s per GB fetched (the partition's "
              f"{summary['partition_cpu_s_per_gb_fetched']}); load average "
              f"{summary['loadavg_before']} -> {summary['loadavg_after']}, {summary['cpus']} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
