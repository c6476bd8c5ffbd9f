"""A Faust app against raylog's Kafka front door: it counts the messages of
each key in a Faust ``Table`` (in memory, ``store="memory://"``, backed by a
compacted changelog topic that Faust creates through the front door) and
writes ``{"count": n}`` to the output topic under the message's key.

It runs in the Faust venv (``make venv-faust`` makes ``.venv-apps/faust`` with
faust-streaming and the aiokafka it speaks Kafka with), beside a raylog
cluster::

    .venv-apps/faust/bin/python apps/faust/count_by_key.py CONFIG.json

``CONFIG.json`` holds:

* ``kafka``: the aiokafka settings of the cluster's listeners,
  ``raylog.Client.kafka_config(dialect="aiokafka")`` as it is (bootstrap
  servers and SASL);
* ``app_id``: Faust's app id (its consumer group, and the prefix of its
  changelog topic, ``{app_id}-counts-changelog``);
* ``input``, ``output``: the topics (JSON values in, JSON counts out; the
  output topic is created by the app, like the changelog, when it is missing);
* ``partitions``: the input topic's partitions (the table's changelog and the
  output topic get as many);
* ``count``: stop after this many messages processed (the table is rebuilt
  from its changelog before the first one: the store is in memory);
* ``idle_timeout_s``: stop sooner when no message came for this long.

It stops itself as an operator stops a Faust worker, with SIGTERM: the worker
waits for the messages in flight, commits their offsets and flushes its
producer (the output and the changelog) on the way out. At the end it prints
one line of JSON, ``{"processed": n}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import faust


def main(config_path: str) -> int:
    with open(config_path) as f:
        config = json.load(f)
    kafka = config["kafka"]
    credentials = None
    if kafka.get("security_protocol", "PLAINTEXT") != "PLAINTEXT":
        credentials = faust.SASLCredentials(username=kafka["sasl_plain_username"],
                                            password=kafka["sasl_plain_password"],
                                            mechanism=kafka["sasl_mechanism"])
    app = faust.App(
        config["app_id"],
        broker=[f"kafka://{server}" for server in kafka["bootstrap_servers"].split(",")],
        broker_credentials=credentials,
        store="memory://",
        topic_partitions=config["partitions"],
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        worker_redirect_stdouts=False,
    )
    source = app.topic(config["input"], key_type=bytes, value_serializer="json")
    sink = app.topic(config["output"], key_type=bytes, value_serializer="json",
                     partitions=config["partitions"])
    counts = app.Table("counts", default=int, partitions=config["partitions"])
    progress = {"processed": 0, "last": time.monotonic(), "stopping": False}

    @app.agent(source)
    async def count(stream):
        await sink.maybe_declare()  # made through the front door (CreateTopics) unless it exists
        async for key, _value in stream.items():
            name = key.decode()
            counts[name] += 1
            await sink.send(key=key, value={"count": counts[name]})
            progress["processed"] += 1
            progress["last"] = time.monotonic()

    @app.timer(0.5)
    async def stop_when_done():
        done = progress["processed"] >= config["count"]
        idle = time.monotonic() - progress["last"] > config["idle_timeout_s"]
        if (done or idle) and not progress["stopping"]:
            progress["stopping"] = True
            os.kill(os.getpid(), signal.SIGTERM)  # the worker's own shutdown: commit, flush, stop

    worker = faust.Worker(app, loglevel="info", stdout=sys.stderr)
    try:
        worker.execute_from_commandline()
    except SystemExit as exit:
        if exit.code not in (None, 0):
            raise
    print(json.dumps({"processed": progress["processed"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
