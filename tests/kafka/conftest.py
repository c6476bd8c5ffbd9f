"""Fixtures of the Kafka front door's tests.

* ``listeners`` (module): the Kafka listeners of the module's
  ``raylog_client`` cluster, started once.
* ``kafka_config`` (function): ``raylog_client.kafka_config()``.

``kafka_raw.RawKafka`` sends requests of its own (what client libraries do
not expose: versions, min bytes, bad frames).
"""

from __future__ import annotations


import pytest



@pytest.fixture(scope="module")
def listeners(raylog_client):
    entries = raylog_client.start_kafka_listeners()
    assert entries and all(e["port"] > 0 for e in entries)
    return entries


@pytest.fixture
def kafka_config(raylog_client, listeners):
    return raylog_client.kafka_config()
