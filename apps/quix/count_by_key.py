"""A stateful Quix Streams app against raylog's Kafka front door: it counts the
messages of each key in Quix's state (a RocksDB store per partition, backed by
a compacted changelog topic that Quix creates through the front door) and
writes ``{"count": n}`` to the output topic under the message's key, with
``processing_guarantee="at-least-once"`` (or the config's
``processing_guarantee``: ``"exactly-once"`` runs on Kafka transactions).

It runs in the Quix venv (``make venv-quix`` makes ``.venv-apps/quix``; Quix
Streams pins confluent-kafka and pydantic of its own), beside a raylog cluster::

    .venv-apps/quix/bin/python apps/quix/count_by_key.py CONFIG.json

``CONFIG.json`` holds:

* ``kafka``: the librdkafka settings of the cluster's listeners,
  ``raylog.Client.kafka_config()`` as it is (bootstrap servers and SASL);
* ``input``, ``output``: the topics (JSON values in, JSON counts out);
* ``consumer_group``, ``state_dir``;
* ``count``: stop after this many messages processed (after Quix's rebalance
  and its recovery of the state from the changelog);
* ``commit_every`` (optional): a checkpoint after this many messages too
  (Quix's default: every 5 s only);
* ``idle_timeout_s``: stop sooner when no message came for this long;
* ``processing_guarantee`` (optional): ``"at-least-once"`` (the default) or
  ``"exactly-once"``.

At the end it prints one line of JSON, ``{"processed": n}``; the state is
committed (changelog flushed, offsets committed) on the way out, as at every
checkpoint.
"""

from __future__ import annotations

import json
import sys

from quixstreams import Application, State
from quixstreams.kafka.configuration import ConnectionConfig


def count(value: dict, state: State) -> dict:
    """The number of messages of this message's key so far (the state is per key)."""
    n = state.get("count", 0) + 1
    state.set("count", n)
    return {"count": n}


def main(config_path: str) -> int:
    with open(config_path) as f:
        config = json.load(f)
    app = Application(
        broker_address=ConnectionConfig.from_librdkafka_dict(config["kafka"]),
        consumer_group=config["consumer_group"],
        processing_guarantee=config.get("processing_guarantee", "at-least-once"),
        state_dir=config["state_dir"],
        auto_offset_reset="earliest",
        commit_every=config.get("commit_every", 0),
    )
    source = app.topic(config["input"], key_deserializer="str", value_deserializer="json")
    sink = app.topic(config["output"], key_serializer="str", value_serializer="json")
    app.dataframe(source).apply(count, stateful=True).to_topic(sink)
    outputs = app.run(count=config["count"], timeout=config["idle_timeout_s"])
    print(json.dumps({"processed": len(outputs)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
