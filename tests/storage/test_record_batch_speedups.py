"""Format 2's compiled fast path (raylog.storage._speedups, batch_*) gives
exactly what the Python reference (raylog.storage.record_batch) gives:
the same bytes, the same records, the same verdicts and errors."""

import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raylog.errors import InvalidMessageError
from raylog.storage import record_batch as rb

BOTH_IMPLEMENTATIONS = True  # compares the two itself (tests/storage/conftest.py)

pytestmark = pytest.mark.skipif(rb._speedups is None, reason="raylog.storage._speedups (format 2) is not built")
SPEEDUPS = rb._speedups

blobs = st.one_of(st.none(), st.binary(max_size=300))
headers_st = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=4)
records_st = st.lists(st.tuples(blobs, blobs, st.one_of(st.none(), headers_st)), min_size=1, max_size=40)


def _both(monkeypatch, fn, *args, **kwargs):
    """(fast result or error, reference result or error)."""
    def run():
        try:
            return fn(*args, **kwargs)
        except InvalidMessageError as err:
            return (type(err), str(err), err.details)
    fast = run()
    with monkeypatch.context() as m:
        m.setattr(rb, "_speedups", None)
        reference = run()
    return fast, reference


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(blobs, min_size=1, max_size=60), keyed=st.booleans(), keys=st.lists(blobs, min_size=60, max_size=60),
       ts=st.integers(-(2**63), 2**63 - 1))
def test_encode_identical(monkeypatch, values, keyed, keys, ts):
    keys = keys[: len(values)] if keyed else None
    fast, reference = _both(monkeypatch, rb.encode_batch, values, keys, None, ts)
    assert fast == reference
    assert SPEEDUPS.batch_records(values, keys) is not None  # the fast path was taken


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=records_st, base=st.integers(0, 2**40), skip=st.integers(0, 45))
def test_decode_identical(monkeypatch, records, base, skip):
    batch = rb.stamp(rb.encode_batch([r[1] for r in records], [r[0] for r in records], [r[2] for r in records], 7), base)
    fast, reference = _both(monkeypatch, rb.decode_batch, batch, 0, base + skip)
    assert fast == reference
    assert SPEEDUPS.batch_decode(batch, rb.HEADER_SIZE, len(batch), len(records), 7, 7, False, base, skip) is not None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=records_st, data=st.data())
def test_damaged_records_same_verdict(monkeypatch, records, data):
    """Random byte changes in the records section (crc made right again, so
    the walk of the records is what decides): same result, same error."""
    batch = bytearray(rb.encode_batch([r[1] for r in records], [r[0] for r in records], [r[2] for r in records], 7))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(rb.HEADER_SIZE, len(batch) - 1))
        batch[at] = data.draw(st.integers(0, 255))
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    batch = bytes(batch)
    for fn in (rb.validate_batch, rb.decode_batch):
        fast, reference = _both(monkeypatch, fn, batch)
        assert fast == reference


def test_fast_path_declines_what_it_does_not_handle():
    assert SPEEDUPS.batch_records([b"a", "str"], None) is None
    assert SPEEDUPS.batch_records([b"a"], [b"k", b"k"]) is None
    assert SPEEDUPS.batch_records(iter([b"a"]), None) is None
    batch = rb.encode_batch([b"a"], timestamp_ms=0)
    # a size past the buffer or a negative position: declined, not read
    assert SPEEDUPS.batch_validate(batch, rb.HEADER_SIZE, len(batch) + 1, 1, 0, 0, False) is False
    assert SPEEDUPS.batch_decode(batch, -1, len(batch), 1, 0, 0, False, 0, 0) is None
    assert SPEEDUPS.batch_decode(batch, 70, 69, 1, 0, 0, False, 0, 0) is None
    assert SPEEDUPS.batch_validate(batch, rb.HEADER_SIZE, len(batch), 1, 0, 0, False) is True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=records_st, codec=st.sampled_from(["gzip", "snappy", "lz4", "zstd"]), data=st.data())
def test_compressed_batches_same_verdict(monkeypatch, records, codec, data):
    """The fast path also walks a decompressed records section: same records, or same error."""
    plain = bytearray(rb.encode_batch([r[1] for r in records], [r[0] for r in records], [r[2] for r in records], 7))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(rb.HEADER_SIZE, len(plain) - 1))
        plain[at] = data.draw(st.integers(0, 255))
    section = rb._compress(rb._codec_of(codec), bytes(plain[rb.HEADER_SIZE:]))
    head = bytearray(plain[: rb.HEADER_SIZE])
    struct.pack_into(">h", head, 21, rb._codec_of(codec))
    struct.pack_into(">i", head, 8, rb.HEADER_SIZE - 12 + len(section))
    struct.pack_into(">i", head, 23, rb.HEADER_SIZE + len(section) - 1)
    batch = bytearray(bytes(head) + section)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    for fn in (rb.validate_batch, rb.decode_batch):
        fast, reference = _both(monkeypatch, fn, bytes(batch))
        assert fast == reference


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(blobs, min_size=1, max_size=60), keys=st.one_of(st.none(), st.lists(blobs, min_size=60, max_size=60)),
       ts=st.integers(-(2**63), 2**63 - 1), producer=st.tuples(st.integers(-1, 2**63 - 1), st.integers(-1, 2**15 - 1),
                                                             st.integers(-1, 2**31 - 1)),
       flags=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_whole_batch_encode_identical(monkeypatch, values, keys, ts, producer, flags):
    keys = None if keys is None else keys[: len(values)]
    pid, epoch, seq = producer
    kwargs = dict(producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=flags[0],
                  control=flags[1], log_append_time=flags[2])
    fast, reference = _both(monkeypatch, rb.encode_batch, values, keys, None, ts, None, **kwargs)
    assert fast == reference
    assert SPEEDUPS.batch_encode(values, keys, ts, 0, pid, epoch, seq) is not None  # the fast path was taken


def test_whole_batch_encode_declines():
    assert SPEEDUPS.batch_encode([], None, 0, 0, -1, -1, -1) is None
    assert SPEEDUPS.batch_encode(iter([b"a"]), None, 0, 0, -1, -1, -1) is None
    assert SPEEDUPS.batch_encode([b"a"], None, 0, 1 << 16, -1, -1, -1) is None
    assert SPEEDUPS.batch_encode([b"a"], None, 0, 0, -1, 1 << 15, -1) is None
    assert SPEEDUPS.batch_encode([b"a"], None, 2**63, 0, -1, -1, -1) is None


# -- the append side: prepare, stamp and the time index's pass, in one compiled pass each


def _batches_st():
    """Record batches back to back as an append brings them: plain ones (some
    idempotent, some with a Kafka client's lastOffsetDelta), compressed and
    control ones between them."""
    one = st.tuples(records_st, st.sampled_from([None, None, None, "gzip", "control", "kafka"]),
                    st.integers(-1, 5), st.integers(0, 2**31 - 100))
    return st.lists(one, min_size=1, max_size=8)


def _append_bytes(batches) -> bytes:
    out = bytearray()
    for records, kind, producer, sequence in batches:
        kw = {}
        if producer >= 0:
            kw = {"producer_id": producer, "producer_epoch": 0, "base_sequence": sequence}
        if kind == "control":
            kw = {"control": True, "transactional": True, "producer_id": 1, "producer_epoch": 0, "base_sequence": -1}
        batch = bytearray(rb.encode_batch([r[1] for r in records], [r[0] for r in records], [r[2] for r in records], 7,
                                          "gzip" if kind == "gzip" else None, **kw))
        if kind == "kafka":  # a Kafka client's lastOffsetDelta (count - 1), its crc made again
            struct.pack_into(">i", batch, 23, len(records) - 1)
            struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
        out += batch
    return bytes(out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=_batches_st(), base=st.integers(0, 2**40), epoch=st.integers(-1, 2**31 - 1), data=st.data())
def test_append_prepare_and_stamp_identical(monkeypatch, batches, base, epoch, data):
    from raylog.storage.batch_validation import prepare_append, stamp_batches
    from raylog.storage.timeindex import batch_timestamps, batch_timestamps_reference

    buf = _append_bytes(batches)
    if data.draw(st.booleans()):  # damage one byte anywhere: both refuse it alike (or both take it)
        at = data.draw(st.integers(0, len(buf) - 1))
        buf = buf[:at] + bytes([buf[at] ^ data.draw(st.integers(1, 255))]) + buf[at + 1:]

    def prepared_and_stamped():
        prepared = prepare_append(buf, 1 << 20, 1 << 24)
        stamped = stamp_batches(prepared, base, epoch)
        return bytes(prepared.data), prepared.headers, prepared.records, stamped

    fast, reference = _both(monkeypatch, prepared_and_stamped)
    assert fast == reference
    if not isinstance(fast, tuple) or isinstance(fast[0], type):
        return
    stored = fast[0]
    assert batch_timestamps(stored) == batch_timestamps_reference(stored)
    assert batch_timestamps(stored, 0, len(stored) - 1) == batch_timestamps_reference(stored, 0, len(stored) - 1)


def test_the_append_passes_are_taken_for_plain_batches():
    buf = _append_bytes([([(None, b"v", None)] * 3, None, 4, 10), ([(b"k", None, [("h", b"")])], "kafka", -1, 0)])
    pairs, records, stop = SPEEDUPS.batches_prepare(buf, 0, len(buf), 1 << 20, rb.BatchHeader)
    assert stop == len(buf) and records == 4 and [at for at, _ in pairs] == [0, len(buf) - pairs[1][1].size]
    assert pairs[0][1] == rb.read_header(buf, 0)
    stored = bytearray(buf)
    stamped = SPEEDUPS.batches_stamp(stored, 0, len(stored), 500, 3, rb.BatchHeader)
    assert [offset for offset, _ in stamped] == [500, 500 + pairs[1][0]]
    assert all(h.partition_leader_epoch == 3 and h.last_offset_delta == h.size - 1 for _, h in stamped)
    assert SPEEDUPS.batches_stamp(stored, 0, len(stored) - 1, 0, 0, rb.BatchHeader) is None  # not whole batches
