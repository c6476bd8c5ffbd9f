"""Fixtures shared by the storage tests.

Every storage test runs against each implementation of the message code
and the log cleaner: ``c`` (the compiled fast paths,
``raylog.storage._speedups`` and ``raylog.storage._compaction``, with the
Python reference behind them) and ``python`` (the reference alone). The ``c`` run is
skipped when the module is not built. A test module that compares the two
itself sets ``BOTH_IMPLEMENTATIONS = True`` and runs once.
"""

import pytest

from raylog.storage import cleaner as cleaner_module
from raylog.storage import message as message_module
from raylog.storage import offsetmap as offsetmap_module

#: every codec a message set can be written with; suites run against each
COMPRESSIONS = [None, "gzip", "zstd", "lz4"]
#: every implementation of the message code; suites run against each
IMPLEMENTATIONS = ["c", "python"]

try:
    from raylog.storage import _speedups as SPEEDUPS
except ImportError:
    SPEEDUPS = None


def pytest_generate_tests(metafunc):
    if "implementation" in metafunc.fixturenames and not getattr(metafunc.module, "BOTH_IMPLEMENTATIONS", False):
        metafunc.parametrize("implementation", IMPLEMENTATIONS, indirect=True)


@pytest.fixture(autouse=True)
def implementation(request, monkeypatch):
    """The message code the test runs against (see the module docstring)."""
    impl = getattr(request, "param", None)
    if impl == "c":
        if SPEEDUPS is None:
            pytest.skip("raylog.storage._speedups is not built")
        use_implementation(monkeypatch, impl)
    elif impl == "python":
        use_implementation(monkeypatch, impl)
    return impl


def use_implementation(monkeypatch, impl):
    """Switch raylog.storage.message and the cleaner to ``impl`` ("c" or "python") until the test ends."""
    fast = SPEEDUPS if impl == "c" else None
    monkeypatch.setattr(message_module, "_speedups", fast)
    monkeypatch.setattr(message_module, "ACCELERATED", fast is not None)
    if impl == "python":
        monkeypatch.setattr(cleaner_module, "_compaction", None)
        monkeypatch.setattr(offsetmap_module, "_compaction", None)


@pytest.fixture(params=["c", "python"])
def batch_implementation(request, monkeypatch):
    """The format-2 code (raylog.storage.record_batch) the test runs against:
    the compiled fast path or the Python reference; a module takes it for
    every test with ``pytestmark = pytest.mark.usefixtures("batch_implementation")``."""
    from raylog.storage import record_batch

    if request.param == "c":
        if record_batch._speedups is None:
            pytest.skip("raylog.storage._speedups (with format 2) is not built")
    else:
        monkeypatch.setattr(record_batch, "_speedups", None)
    return request.param


@pytest.fixture(params=COMPRESSIONS, ids=lambda c: c or "none")
def compression(request):
    return request.param


import os  # noqa: E402

from raylog.storage.decoding import decode_messages  # noqa: E402


def read_all(log, start=None, max_bytes=4096):
    """Every record from ``start`` (default: the log start) to the high
    watermark, read the way a consumer does: slices, pread, decode."""
    offset = log.log_start_offset if start is None else start
    high_watermark = log.high_watermark  # a background flush may move it meanwhile
    records = []
    while offset < high_watermark:
        chunk = log.read(offset, max_bytes)
        assert chunk.offset == offset and chunk.length > 0
        data = os.pread(chunk.file.fileno(), chunk.length, chunk.position)
        batch, consumed = decode_messages(data, offset)
        assert consumed > 0
        records.extend(batch)
        offset += consumed
    assert offset == high_watermark
    return records


def crash(log):
    """Drop a log without closing it, as a killed process would: no flush, no
    checkpoint; the bytes stay as written. (Waits for a background flush in
    progress, so that it does not write after the "crash".) The directory
    lock is released, as the end of a process releases it."""
    with log._flush_lock:  # noqa: SLF001
        log._closed = True  # noqa: SLF001
        log._producers.close()  # noqa: SLF001
        log._txn_indexes.close()  # noqa: SLF001
        os.close(log._lock_fd)  # noqa: SLF001


def flip_byte(path, position, mask=0x20):
    """Damage one byte of a file in place (fault injection)."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ mask]))


def committed_values(log, start=0):
    """The record values a ``read_committed`` reader gets from ``start``:
    reads up to the last stable offset (``PartitionLog.read_committed``),
    dropping the batches of the aborted transactions each read names (as
    Kafka's consumers do) and the markers."""
    from raylog.storage.record_batch import decode_batch, iter_batches

    out, offset = [], start
    while True:
        read = log.read_committed(offset, 1 << 20)
        data = read.slice.tobytes()
        if not data:
            return out
        aborted = {}
        for txn in read.aborted:
            aborted.setdefault(txn.producer_id, []).append(txn)
        next_offset = None
        for pos, header in iter_batches(data):
            at = header.base_offset  # (stored batches carry their offsets; a cleaned segment's are not positions)
            assert at < read.last_stable_offset, "a read_committed read handed out a batch past the LSO"
            next_offset = header.next_offset
            if header.control:
                continue
            if header.transactional and any(t.first_offset <= at < t.last_offset
                                            for t in aborted.get(header.producer_id, ())):
                continue
            out.extend(r.value for r in decode_batch(data, pos).records if r.offset >= offset)
        assert next_offset is not None, "a read_committed read handed out no whole batch"
        offset = next_offset
