"""FETCH version 1 (an isolation level; raylog.transfer.protocol): a
read_committed FETCH answers the bytes below the last stable offset with
the aborted transactions they overlap, waits at the last stable offset
while a transaction is open, and version 0 frames are answered as before.
Real partition logs and a real data server on 127.0.0.1."""

from __future__ import annotations

import threading
import time

import pytest

from raylog.storage.aborted_reads import aborted_ranges, drop_aborted
from raylog.errors import NotOwnerError, ProtocolError
from raylog.storage.decoding import decode_messages
from raylog.storage.record_batch import encode_batch
from raylog.transfer.protocol import READ_COMMITTED, READ_UNCOMMITTED, REQUEST_HEADER
from raylog.transfer.requests import decode_request, encode_fetch

TOPIC = "clicks"


def _txn(values, pid):
    return encode_batch(values, timestamp_ms=1, producer_id=pid, producer_epoch=0, base_sequence=0,
                        transactional=True)


def _plain(values):
    return encode_batch(values, timestamp_ms=1)


def _values(result):
    """What a read_committed reader hands out of one reply."""
    records, _ = decode_messages(bytes(result.data), result.offset)
    kept = drop_aborted([_Rec(r[0], r[3]) for r in records], aborted_ranges(result.data, result.aborted))
    return [r.value for r in kept]


class _Rec:
    def __init__(self, offset, value):
        self.offset, self.value = offset, value


def test_the_version_1_frame_round_trips_and_an_unknown_isolation_is_refused():
    frame = encode_fetch(9, TOPIC, 2, 100, 4096, 50, READ_COMMITTED)
    assert decode_request(frame, 0, len(frame) - 4).isolation == READ_COMMITTED
    old = encode_fetch(9, TOPIC, 2, 100, 4096, 50)
    assert decode_request(old, 0, len(old) - 4).isolation is None
    bad = frame[:-1] + b"\x07"
    with pytest.raises(ProtocolError, match="isolation level 7"):
        decode_request(bad, 0, len(bad) - 4)
    assert REQUEST_HEADER.unpack_from(frame)[2] == 1 and REQUEST_HEADER.unpack_from(old)[2] == 0


@pytest.mark.file_log_only
def test_read_committed_stops_at_the_lso_and_names_the_aborted(conn, plog):
    plog.append(_plain([b"p0"]))
    t7 = plog.append(_txn([b"aborted-1", b"aborted-2"], pid=7))
    plog.append(_plain([b"p1"]))
    t8 = plog.append(_txn([b"open"], pid=8))
    plog.append(_plain([b"p2"]))
    plog.append_marker(7, 0, False, 0)
    plog.flush()
    hw = plog.high_watermark
    uncommitted = conn.fetch(TOPIC, 0, 0, 1 << 20, isolation=READ_UNCOMMITTED)
    assert (uncommitted.last_stable_offset, uncommitted.aborted) == (hw, ())
    old = conn.fetch(TOPIC, 0, 0, 1 << 20)  # version 0, as before
    assert old.last_stable_offset is None and len(old.data) == len(uncommitted.data) == hw
    committed = conn.fetch(TOPIC, 0, 0, 1 << 20, isolation=READ_COMMITTED)
    assert committed.last_stable_offset == t8 and len(committed.data) == t8
    assert [(pid, first) for pid, first, _ in committed.aborted] == [(7, t7)]
    assert _values(committed) == [b"p0", b"p1"]
    # at the LSO: nothing, and a long poll waits for the transaction's end
    started = time.monotonic()
    empty = conn.fetch(TOPIC, 0, t8, 1 << 20, 300, isolation=READ_COMMITTED)
    assert len(empty.data) == 0 and time.monotonic() - started >= 0.25

    def commit_later():
        time.sleep(0.3)
        plog.append_marker(8, 0, True, 0)
        plog.flush()

    thread = threading.Thread(target=commit_later)
    thread.start()
    try:
        after = conn.fetch(TOPIC, 0, t8, 1 << 20, 20_000, isolation=READ_COMMITTED)
    finally:
        thread.join()
    assert after.last_stable_offset == plog.high_watermark
    assert b"".join(_values(after)) == b"openp2"
    # accepted data is intact for every reader
    assert len(conn.fetch(TOPIC, 0, 0, 1 << 20).data) == plog.high_watermark


@pytest.mark.file_log_only
def test_the_aborted_transactions_of_a_read_are_named_in_the_reply(conn, plog):
    t7 = plog.append(_txn([b"a"], pid=7))
    plog.append(_plain([b"p"]))
    plog.append_marker(7, 0, False, 0)
    t9 = plog.append(_txn([b"c"], pid=9))
    plog.append_marker(9, 0, True, 0)
    plog.flush()
    result = conn.fetch(TOPIC, 0, 0, 1 << 20, isolation=READ_COMMITTED)
    assert [(pid, first) for pid, first, _ in result.aborted] == [(7, t7)]
    assert _values(result) == [b"p", b"c"]
    assert t7 < t9 < result.last_stable_offset == plog.high_watermark


def test_a_log_without_read_committed_sends_readers_to_the_leader(make_server, make_conn, make_log, log_kind):
    if log_kind != "memory":
        pytest.skip("the log held in memory has no read_committed")
    plog = make_log()
    plog.append(_plain([b"kept"]))
    plog.flush()
    conn = make_conn(make_server({(TOPIC, 0): plog}))
    with pytest.raises(NotOwnerError, match="leader"):
        conn.fetch(TOPIC, 0, 0, 4096, isolation=READ_COMMITTED)
    records, _ = decode_messages(bytes(conn.fetch(TOPIC, 0, 0, 4096).data), 0)
    assert [r[3] for r in records] == [b"kept"]


@pytest.mark.file_log_only
def test_a_read_committed_locate_stops_at_the_lso_and_names_the_aborted(conn, plog):
    """LOCATE version 1: the batches located lie below the last stable
    offset, with the aborted transactions named; version 0 as before."""
    t7 = plog.append(_txn([b"gone"], pid=7))
    plog.append_marker(7, 0, False, 0)
    plog.append(_plain([b"p"]))
    t8 = plog.append(_txn([b"open"], pid=8))
    plog.flush()
    located = conn.locate(TOPIC, 0, 0, 1 << 20, READ_COMMITTED)
    assert located.last_stable_offset == t8 and located.position + located.length <= t8
    assert located.next_offset == t8
    assert [(pid, first) for pid, first, _ in located.aborted] == [(7, t7)]
    at_lso = conn.locate(TOPIC, 0, t8, 1 << 20, READ_COMMITTED)
    assert at_lso.length == 0 and at_lso.next_offset == t8
    uncommitted = conn.locate(TOPIC, 0, 0, 1 << 20, READ_UNCOMMITTED)
    assert (uncommitted.last_stable_offset, uncommitted.aborted) == (plog.high_watermark, ())
    old = conn.locate(TOPIC, 0, 0, 1 << 20)
    assert old.last_stable_offset is None and old.next_offset == plog.high_watermark


def test_kafkas_rule_drops_only_the_aborted_producers_batches_up_to_the_marker():
    """aborted_ranges: a transactional batch of the producer at or after the
    aborted transaction's first offset and before its marker; another
    producer's, a plain batch and the producer's later transaction stay."""
    batches, offset = [], 0
    for batch in (_txn([b"x"], pid=7), _txn([b"y"], pid=8), _plain([b"p"]), _txn([b"z"], pid=7)):
        stamped = bytearray(batch)
        stamped[:8] = offset.to_bytes(8, "big")
        batches.append((offset, bytes(stamped)))
        offset += len(stamped)
    data = b"".join(b for _, b in batches)
    (x, _), (y, _), (p, _), (z, _) = batches
    assert aborted_ranges(data, [(7, x, y + 1)]) == [(x, x + len(batches[0][1]))]
    assert aborted_ranges(data, [(7, x, offset)]) == [(x, x + len(batches[0][1])), (z, offset)]
    assert aborted_ranges(data, []) == [] and aborted_ranges(data, [(9, 0, offset)]) == []
    kept = drop_aborted([_Rec(o, v) for o, v in ((x, b"x"), (y, b"y"), (p, b"p"), (z, b"z"))],
                        aborted_ranges(data, [(7, x, y + 1)]))
    assert [r.value for r in kept] == [b"y", b"p", b"z"]
