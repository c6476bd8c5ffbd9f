"""Fetch responses written directly (raylog.kafka.fetch_wire) read back by
kafka-python's own decoder, every version served (pure: no cluster)."""

from __future__ import annotations

import io

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from raylog.kafka.fetch_wire import HIGHEST, LOWEST, encode_fetch_response


def _batch(values) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, 1_000 + i, None, value, [("h", b"v")])
    return bytes(builder.build())


@pytest.mark.parametrize("version", range(LOWEST, HIGHEST + 1))
def test_every_version_reads_back_with_kafka_python(version):
    records = _batch([b"a", b"bb"])
    topics = [("t1", [(0, 0, 500, 7, memoryview(records)), (3, 1, -1, -1, b"")]), ("t2", [(1, 0, 9, 0, b"")])]
    frame = encode_fetch_response(version, 42, topics)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert int.from_bytes(frame[4:8], "big") == 42
    body = 9 if version >= 12 else 8  # version 12's header ends with (empty) tagged fields
    assert version < 12 or frame[8] == 0
    response = FetchResponse[version].decode(io.BytesIO(frame[body:]))
    got = [(t.topic, [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                       p.log_start_offset if version >= 5 else None, bytes(p.records or b""))
                      for p in t.partitions]) for t in response.responses]
    log_start = (lambda x: x) if version >= 5 else (lambda x: None)
    assert got == [("t1", [(0, 0, 500, 500, log_start(7), records), (3, 1, -1, -1, log_start(-1), b"")]),
                   ("t2", [(1, 0, 9, 9, log_start(0), b"")])]
    assert response.throttle_time_ms == 0


@pytest.mark.parametrize("version", range(LOWEST, HIGHEST + 1))
def test_every_version_is_byte_for_byte_kafka_pythons_own_encoding(version):
    """The direct encoder writes what kafka-python's generic schema codec
    (which served Fetch before it) writes for the same answer."""
    from kafka.protocol.consumer import FetchResponse as Response

    records = _batch([b"x" * 300, None, b""]) + _batch([b"y"])
    topics = [("t\u00e9", [(2, 0, 1_000, 3, records), (0, 6, -1, -1, b"")])]
    Topic = Response.FetchableTopicResponse
    Partition = Topic.PartitionData
    generic = Response[version](
        throttle_time_ms=0, error_code=0, session_id=0,
        responses=[Topic(topic=name, partitions=[
            Partition(partition_index=p, error_code=code, high_watermark=hw, last_stable_offset=hw,
                      log_start_offset=start, aborted_transactions=[], preferred_read_replica=-1, records=data)
            for p, code, hw, start, data in parts]) for name, parts in topics]).encode()
    frame = encode_fetch_response(version, 7, topics)
    assert frame[9 if version >= 12 else 8:] == generic


def test_served_versions_are_the_listeners():
    """The encoder serves every Fetch version the listener advertises
    (raylog.kafka.frames.SUPPORTED), so none falls back to another codec."""
    from raylog.kafka.frames import SUPPORTED

    _, low, high = SUPPORTED[1]
    assert (low, high) == (LOWEST, HIGHEST)


def test_records_in_a_file_range_are_the_frame_pieces_around_it(tmp_path):
    """A partition's records given as a FileRange (batches located in their
    segment file) leave the frame in pieces: the bytes before it, the range,
    the bytes after; together the same frame as with the bytes themselves."""
    import os

    from raylog.kafka.file_ranges import FileRange

    records = _batch([b"a" * 100, b"b"]) + _batch([b"c"])
    path = tmp_path / "segment"
    path.write_bytes(b"\0" * 50 + records + b"\0" * 7)
    topics = lambda first: [("t", [(0, 0, 900, 0, first), (1, 0, 5, 0, b"")]), ("u", [(2, 0, 8, 0, records)])]
    whole = encode_fetch_response(11, 3, topics(records))
    with open(path, "rb", buffering=0) as f:
        pieces = encode_fetch_response(11, 3, topics(FileRange(f, 50, len(records))))
        assert [type(piece) for piece in pieces] == [bytes, FileRange, bytes]
        got = pieces[0] + os.pread(f.fileno(), len(pieces[1]), pieces[1].position) + pieces[2]
    assert got == whole


@pytest.mark.parametrize("version", [11, 12])
def test_aborted_transactions_read_back_in_the_flexible_and_older_forms(version):
    records = _batch([b"a"])
    topics = [("t", [(0, 0, 900, 0, records, 400, [(7, 100), (9, 250)])])]
    frame = encode_fetch_response(version, 5, topics)
    response = FetchResponse[version].decode(io.BytesIO(frame[9 if version >= 12 else 8:]))
    (partition,) = response.responses[0].partitions
    assert partition.last_stable_offset == 400
    assert [(a.producer_id, a.first_offset) for a in partition.aborted_transactions] == [(7, 100), (9, 250)]
    assert bytes(partition.records) == records
