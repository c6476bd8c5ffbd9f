"""The listener survives what it is sent: random frames, unknown APIs and
versions, huge sizes, stalled peers; its other connections keep being served
(a real client on the same listener afterwards)."""

from __future__ import annotations

import random
import socket
import struct
import time
import uuid

import pytest

from kafka_raw import RawKafka, bootstrap

confluent_kafka = pytest.importorskip("confluent_kafka")

WAIT_S = 60.0


def _closed_or_answered(raw: RawKafka) -> bytes | None:
    try:
        return raw.read_frame()
    except (ConnectionResetError, BrokenPipeError):
        return None


def test_random_frames_close_the_connection_and_others_are_served(raylog_client, kafka_config):
    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic)
    # an authenticated connection held open across the fuzzing
    with RawKafka(kafka_config) as held:
        held.authenticate()
        rng = random.Random(33)
        outcomes = {"closed": 0, "answered": 0}
        for i in range(60):
            with RawKafka(kafka_config, timeout_s=WAIT_S) as raw:
                if i % 3 == 0:
                    raw.authenticate()  # garbage after authentication too
                kind = i % 6
                if kind == 0:  # random bytes of a random length
                    raw.send_raw(rng.randbytes(rng.randrange(0, 200)))
                elif kind == 1:  # an unknown api key
                    raw.send_raw(struct.pack(">hhih", rng.randrange(60, 32767), 0, i, -1))
                elif kind == 2:  # a served key at a version not served
                    raw.send_raw(struct.pack(">hhih", rng.choice([0, 1, 2, 3, 17, 36]), rng.randrange(20, 300), i, -1))
                elif kind == 3:  # a valid header, a random body
                    raw.send_raw(struct.pack(">hhih", rng.choice([0, 1, 2, 3]), 5, i, -1) + rng.randbytes(40))
                elif kind == 4:  # a huge size, then nothing
                    raw.sock.sendall(struct.pack(">i", rng.choice([2**31 - 1, 1 << 30, -5])))
                else:  # an array that claims 2**31 - 1 elements
                    raw.send_raw(struct.pack(">hhih", 3, 1, i, -1) + struct.pack(">i", 2**31 - 1))
                outcome = _closed_or_answered(raw)
                if outcome is None:
                    outcomes["closed"] += 1
                else:  # a body that happens to decode: a well-formed answer to it
                    assert kind == 3 and struct.unpack_from(">i", outcome)[0] == i, (kind, outcome[:16])
                    outcomes["answered"] += 1
        assert outcomes["closed"] >= 50, outcomes
        # a frame started and never finished holds nothing beyond its timeout; the
        # connection held open all along still works
        from kafka.protocol.metadata import MetadataRequest, MetadataResponse

        answer = held.request(MetadataRequest[1](topics=[MetadataRequest.MetadataRequestTopic(name=topic)]),
                              MetadataResponse)
        assert [t.name for t in answer.topics] == [topic] and answer.topics[0].error_code == 0

    # a real client on the same listener after all that
    producer = confluent_kafka.Producer({**kafka_config, "acks": "all"})
    producer.produce(topic, b"after the fuzz", partition=0)
    assert producer.flush(WAIT_S) == 0
    consumer = raylog_client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    try:
        got = []
        deadline = time.monotonic() + WAIT_S
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=1000)
    finally:
        consumer.close()
    assert [m.value for m in got] == [b"after the fuzz"]


def test_an_api_versions_request_of_a_newer_version_gets_unsupported_version(kafka_config):
    from kafka.protocol.metadata import ApiVersionsResponse

    with RawKafka(kafka_config) as raw:
        raw.send_raw(struct.pack(">hhih", 18, 9, 1, -1))
        payload = raw.read_frame()
    assert payload is not None
    answer = ApiVersionsResponse.decode(payload[4:], version=0)
    assert answer.error_code == 35
    assert {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}[0] == (0, 9)  # advertised from 0, served from 3


def test_a_stalled_frame_does_not_stop_other_connections(kafka_config):
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    with socket.create_connection(bootstrap(kafka_config), timeout=WAIT_S) as stalled:
        stalled.sendall(struct.pack(">i", 1000) + b"\x00\x12")  # a frame of 1000 bytes, 2 sent
        with RawKafka(kafka_config) as raw:
            answer = raw.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"),
                                 ApiVersionsResponse)
    assert answer.error_code == 0
