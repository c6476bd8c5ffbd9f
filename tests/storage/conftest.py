"""Fixtures shared by the storage tests."""

import pytest

#: every codec a message set can be written with; suites run against each
COMPRESSIONS = [None, "gzip", "zstd", "lz4"]


@pytest.fixture(params=COMPRESSIONS, ids=lambda c: c or "none")
def compression(request):
    return request.param


import os  # noqa: E402

from raylog.storage.message import decode_messages  # noqa: E402


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
    progress, so that it does not write after the "crash".)"""
    with log._flush_lock:  # noqa: SLF001
        log._closed = True  # noqa: SLF001


def flip_byte(path, position, mask=0x20):
    """Damage one byte of a file in place (fault injection)."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ mask]))
