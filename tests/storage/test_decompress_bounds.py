"""Decompression bounded as it runs, per codec: a zip bomb of each codec
(256 MiB of zeros in a few KiB, compressed here without ever holding them)
is refused with InflatedSizeTooLargeError while no more than about the bound
is held; output at the bound is taken, one byte past it is not; broken
streams are InvalidMessageError. Memory is measured with tracemalloc (the
codecs' output buffers are Python bytes), with wide margins."""

import struct
import tracemalloc
import zlib

import lz4.frame
import pytest
import zstandard

from raylog.errors import InflatedSizeTooLargeError, InvalidMessageError
from raylog.storage.compression import CODEC_GZIP, CODEC_LZ4, CODEC_ZSTD, decompress

BOMB_BYTES = 256 << 20
BOUND = 1 << 20
#: what a refused bomb may hold at its peak: the bound and a chunk or two, with a wide margin
PEAK_BOUND = 8 * BOUND

CODECS = [CODEC_GZIP, CODEC_LZ4, CODEC_ZSTD]
IDS = ["gzip", "lz4", "zstd"]


def _streamed(codec: int, size: int, *, zstd_sized: bool = False) -> bytes:
    """``size`` zero bytes compressed in one stream of ``codec``, fed 1 MiB
    at a time (zstd: without a declared content size unless ``zstd_sized``)."""
    if codec == CODEC_GZIP:
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        parts, finish = [], c.flush
    elif codec == CODEC_LZ4:
        c = lz4.frame.LZ4FrameCompressor()
        parts, finish = [c.begin()], c.flush
    elif zstd_sized:
        c = zstandard.ZstdCompressor(write_content_size=True).compressobj(size=size)
        parts, finish = [], c.flush
    else:
        c = zstandard.ZstdCompressor(write_content_size=False).compressobj()
        parts, finish = [], c.flush
    chunk = bytes(1 << 20)
    for _ in range(size >> 20):
        parts.append(c.compress(chunk))
    parts.append(c.compress(bytes(size & ((1 << 20) - 1))))
    parts.append(finish())
    return b"".join(parts)


def _peak_of(call) -> int:
    tracemalloc.start()
    try:
        call()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.fixture(scope="module")
def bombs():
    return {codec: _streamed(codec, BOMB_BYTES) for codec in CODECS}


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_a_zip_bomb_is_refused_holding_no_more_than_the_bound(bombs, codec):
    bomb = bombs[codec]
    assert len(bomb) < 2 << 20  # a bomb: 256 MiB in at most ~1 MiB (lz4), a few KiB (gzip, zstd)

    def inflate():
        with pytest.raises(InflatedSizeTooLargeError, match="more than the limit"):
            decompress(codec, bomb, BOUND, sized_only=False)

    assert _peak_of(inflate) < PEAK_BOUND


def test_a_zstd_bomb_that_declares_its_size_is_refused_before_inflating():
    bomb = _streamed(CODEC_ZSTD, BOMB_BYTES, zstd_sized=True)
    assert zstandard.frame_content_size(bomb) == BOMB_BYTES

    def inflate():
        with pytest.raises(InflatedSizeTooLargeError, match="claims"):
            decompress(CODEC_ZSTD, bomb, BOUND)

    assert _peak_of(inflate) < PEAK_BOUND


def test_a_zstd_frame_that_understates_its_size_is_refused_within_a_block():
    data = bytes(4 * BOUND)
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(data))
    # frame header: magic (4), descriptor (1; content size field of 4 bytes here), window (1), content size (4)
    assert frame[4] >> 6 == 2 and not frame[4] & 0x20
    struct.pack_into("<I", frame, 6, 1000)  # claims 1000 bytes

    def inflate():
        with pytest.raises((InvalidMessageError, InflatedSizeTooLargeError)):
            decompress(CODEC_ZSTD, bytes(frame), BOUND)

    assert _peak_of(inflate) < PEAK_BOUND


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_output_at_the_bound_is_taken_and_one_byte_past_it_refused(codec):
    at = _streamed(codec, BOUND)
    assert decompress(codec, at, BOUND, sized_only=False) == bytes(BOUND)
    past = _streamed(codec, BOUND + 1)
    with pytest.raises(InflatedSizeTooLargeError):
        decompress(codec, past, BOUND, sized_only=False)


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_truncated_trailing_and_foreign_streams_are_invalid(codec):
    whole = _streamed(codec, 100_000)
    for bad in (whole[:-4], whole + b"tail", b"not a stream of any codec"):
        with pytest.raises(InvalidMessageError):
            decompress(codec, bad, BOUND, sized_only=False)


def test_a_zstd_frame_without_declared_size_is_taken_only_when_asked():
    frame = _streamed(CODEC_ZSTD, 5000)
    assert zstandard.frame_content_size(frame) == -1
    with pytest.raises(InvalidMessageError, match="content size"):
        decompress(CODEC_ZSTD, frame, BOUND)  # raylog's own wrappers always declare it
    assert decompress(CODEC_ZSTD, frame, BOUND, sized_only=False) == bytes(5000)
