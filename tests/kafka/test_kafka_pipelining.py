"""Produce requests that arrive together are pipelined to the partitions
(raylog.kafka.listener, Session.handle_produce_run): each is still answered
in order with its own offsets and errors, acks=0 requests among them are
stored unanswered, a malformed frame after them closes the connection only
after they are answered, and an idempotent producer's batches sent together
are stored once each."""

from __future__ import annotations

import io
import struct
import time
import uuid

import pytest
from kafka_raw import RawKafka

pytest.importorskip("confluent_kafka")

from kafka.protocol.api_header import ResponseHeader  # noqa: E402
from kafka.protocol.producer import ProduceRequest, ProduceResponse  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402

WAIT_S = 60.0
CORRUPT_MESSAGE = 2


def _batch(values, *, producer_id: int = -1, base_sequence: int = -1, headers=()) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=base_sequence, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_000 + i, key=None, value=value, headers=list(headers))
    return bytes(builder.build())


def _damaged(batch: bytes) -> bytes:
    """``batch`` with its last byte flipped: its crc no longer matches."""
    return batch[:-1] + bytes([batch[-1] ^ 0xFF])


def _frame(correlation_id: int, topic: str, partition: int, records: bytes, acks: int = 1) -> bytes:
    Topic = ProduceRequest.TopicProduceData
    request = ProduceRequest[8](transactional_id=None, acks=acks, timeout_ms=30_000, topic_data=[
        Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=partition, records=records)])])
    request.with_header(correlation_id=correlation_id, client_id="pipelined")
    return bytes(request.encode(header=True, framed=True))


def _answers(raw: RawKafka, count: int) -> list:
    """``(correlation id, error code, base offset)`` of the next ``count`` responses."""
    found = []
    for _ in range(count):
        payload = raw.read_frame()
        assert payload is not None, "the listener closed the connection"
        stream = io.BytesIO(payload)
        header = ResponseHeader.decode(stream, flexible=False)
        part = ProduceResponse[8].decode(payload[stream.tell():]).responses[0].partition_responses[0]
        found.append((header.correlation_id, part.error_code, part.base_offset))
    return found


def _values(raylog_client, topic: str, partition: int, count: int) -> list:
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    consumer.assign([(topic, partition)])
    got, deadline = [], time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout_ms=500))
    time.sleep(0.2)
    got.extend(consumer.poll(timeout_ms=200))  # nothing more than asked for
    consumer.close()
    return [(m.offset, m.value) for m in got]


def test_produce_requests_sent_together_are_answered_in_order_each_with_its_own_offset(raylog_client,
                                                                                      kafka_config):
    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic, partitions=2)
    frames, expected = [], {0: [], 1: []}
    plan = []  # (correlation id, partition, values, acks, refused)
    for i in range(16):
        partition = i % 2
        values = [f"r{i}-{j}".encode() for j in range(1 + i % 3)]
        acks = {5: -1, 6: -1, 9: 0}.get(i, 1)  # acks change within the run: -1, -1, then 0
        refused = i == 11  # a batch whose crc does not match: refused, the others stored
        plan.append((i + 1, partition, values, acks, refused))
        frames.append(_frame(i + 1, topic, partition, _damaged(_batch(values)) if refused else _batch(values), acks))
        if not refused:
            expected[partition].append(values)
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        raw.sock.sendall(b"".join(frames))  # all at once: they arrive together
        answered = [p for p in plan if p[3] != 0]
        answers = _answers(raw, len(answered))
    assert [a[0] for a in answers] == [p[0] for p in answered]  # in order, none for acks=0
    offsets = {0: [], 1: []}
    for (correlation, partition, values, _acks, refused), (_, code, base) in zip(answered, answers):
        if refused:
            assert (code, base) == (CORRUPT_MESSAGE, -1)
        else:
            assert code == 0 and base >= 0, (correlation, code, base)
            offsets[partition].append(base)
    for partition in (0, 1):
        assert offsets[partition] == sorted(set(offsets[partition]))  # each its own, increasing
        stored = _values(raylog_client, topic, partition, sum(map(len, expected[partition])))
        assert [v for _, v in stored] == [v for values in expected[partition] for v in values]
        # a batch's base offset is its first record's offset (acks=0 batches have none answered)
        assert set(offsets[partition]) <= {o for o, _ in stored}


@pytest.mark.parametrize("garbage", [
    struct.pack(">hhi", 999, 0, 3) + b"\x00\x00",  # an api key never served
    struct.pack(">hhi", 0, 8, 3) + b"\x00\x03raw\xff\xff\x00",  # a Produce request cut short: in the run
    b"\x7f" * 8,  # a size field over the bound (the frame's size is this garbage's first 4 bytes)
], ids=["unknown-api", "malformed-produce", "size-over-the-bound"])
def test_a_malformed_frame_after_produce_requests_closes_the_connection_after_they_are_answered(
        raylog_client, kafka_config, garbage):
    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic, partitions=1)
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        framed = garbage if garbage.startswith(b"\x7f") else struct.pack(">i", len(garbage)) + garbage
        raw.sock.sendall(_frame(1, topic, 0, _batch([b"a", b"b"])) + _frame(2, topic, 0, _batch([b"c"]))
                         + framed + _frame(3, topic, 0, _batch([b"never"])))
        answers = _answers(raw, 2)
        assert [(a[0], a[1]) for a in answers] == [(1, 0), (2, 0)]
        assert raw.read_frame() is None  # then closed, the frame after it not served
    assert [v for _, v in _values(raylog_client, topic, 0, 3)] == [b"a", b"b", b"c"]


def test_an_idempotent_producers_batches_sent_together_twice_are_stored_once(raylog_client, kafka_config):
    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic, partitions=1)
    batches = [_batch([f"s{i}-{j}".encode() for j in range(3)], producer_id=4242, base_sequence=3 * i)
               for i in range(8)]
    frames = b"".join(_frame(i + 1, topic, 0, b) for i, b in enumerate(batches))
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        raw.sock.sendall(frames + frames)  # every batch, then every batch again (retries)
        answers = _answers(raw, 16)
    assert all(code == 0 for _, code, _ in answers), answers[8:]
    assert [base for _, _, base in answers[8:]] == [base for _, _, base in answers[:8]]  # the first store's
    assert [v for _, v in _values(raylog_client, topic, 0, 24)] == [
        f"s{i}-{j}".encode() for i in range(8) for j in range(3)]
