"""Compression codecs of wrapper messages.

A compressed message set is stored as one wrapper message whose
``attributes`` carry the codec id and whose ``value`` is the compressed bytes
of the inner (uncompressed) message set (see :mod:`raylog.storage.message`).

=====  ======  ===========================================
 id    name    implementation
=====  ======  ===========================================
 0     none    --
 1     gzip    stdlib ``zlib`` with a gzip container (wbits 31)
 2     zstd    ``zstandard``, level 3, one frame that declares its content size
 3     lz4     ``lz4.frame``, content size in the frame
=====  ======  ===========================================

Decompression is always bounded as it runs: :func:`decompress` refuses
output larger than ``max_bytes`` without holding more than about that much
(gzip and lz4 frames are inflated with an output limit of ``max_bytes + 1``:
zlib's ``decompressobj`` ``max_length``, ``lz4.frame``'s ``max_length``; a
zstd frame that declares its content size has it checked first, and libzstd
then fails a frame whose blocks inflate past the declared size within one
block of 128 KiB; a raylog wrapper's zstd frame must declare it, and one
that does not (Kafka's Java producer writes such frames; accepted with
``sized_only=False``) is inflated twice: once in chunks of
:data:`ZSTD_CHUNK_BYTES` that are counted and dropped, stopping past
``max_bytes``, then for its bytes), raising
:class:`raylog.InflatedSizeTooLargeError`. A value that is not a single
well-formed stream of its codec raises :class:`raylog.InvalidMessageError`.
Every decompression of raylog goes through :func:`decompress` (wrappers in
readers and on the data channel, Kafka batches at the listener).

Snappy (Kafka's codec 2 of format 2, :mod:`raylog.storage.record_batch`; not a
codec of format 1's wrappers, so it has no id in :data:`CODEC_NAMES`) goes
through ``cramjam.snappy``: :func:`snappy_compress` writes xerial's framing as
Kafka's Java client does, :func:`snappy_decompress` reads both that and the raw
snappy block librdkafka writes, bounded by the lengths each block declares
(checked before it is inflated). The xerial framing, big-endian::

     field             type   meaning
  1. magic             8s     b"\\x82SNAPPY\\x00"
  2. version           i32    1
  3. compatible        i32    1
  then blocks, back to back to the end of the stream:
  4. block length      i32    bytes of the raw snappy block that follows
  5. block             bytes  one raw snappy block (a varint of its
                              uncompressed length, then the elements)

Format 2 also reads zstd frames that do not declare their content size
(Kafka's Java client writes them): :func:`zstd_decompress_unsized` bounds
such a frame by a limited read before it inflates it whole; and it writes
lz4 as Kafka's Java reader requires (:func:`lz4_compress_kafka`: independent
blocks).

Thread-safety: every function may be called from any thread; codec contexts
that are not thread-safe (zstd) are kept per thread.
"""

from __future__ import annotations

import threading
import zlib

import cramjam
import lz4.frame
import zstandard

from raylog.errors import ConfigError, InflatedSizeTooLargeError, InvalidMessageError

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_ZSTD = 2
CODEC_LZ4 = 3

#: codec name -> id; ``None`` and ``"none"`` mean no compression
CODECS: dict[str | None, int] = {
    None: CODEC_NONE,
    "none": CODEC_NONE,
    "gzip": CODEC_GZIP,
    "zstd": CODEC_ZSTD,
    "lz4": CODEC_LZ4,
}

#: codec id -> name
CODEC_NAMES: dict[int, str] = {CODEC_NONE: "none", CODEC_GZIP: "gzip", CODEC_ZSTD: "zstd", CODEC_LZ4: "lz4"}

GZIP_LEVEL = 6
ZSTD_LEVEL = 3
#: output chunk of the counting pass over a zstd frame without a declared size
ZSTD_CHUNK_BYTES = 128 * 1024

_local = threading.local()


def codec_id(compression: str | None) -> int:
    """The codec id of a compression name (``"gzip"``, ``"zstd"``, ``"lz4"`` or ``None``)."""
    try:
        return CODECS[compression]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown compression {compression!r}; use one of None, 'gzip', 'zstd', 'lz4'"
        ) from None


def _zstd_compressor() -> zstandard.ZstdCompressor:
    ctx = getattr(_local, "zstd_c", None)
    if ctx is None:
        ctx = _local.zstd_c = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return ctx


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    ctx = getattr(_local, "zstd_d", None)
    if ctx is None:
        ctx = _local.zstd_d = zstandard.ZstdDecompressor()
    return ctx


def compress(codec: int, data: bytes) -> bytes:
    """Compress ``data`` with the codec ``codec`` (an id)."""
    if codec == CODEC_GZIP:
        c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == CODEC_ZSTD:
        return _zstd_compressor().compress(data)
    if codec == CODEC_LZ4:
        return lz4.frame.compress(data, store_size=True)
    if codec == CODEC_NONE:
        return bytes(data)
    raise ConfigError(f"unknown codec id {codec!r}; use 0 (none), 1 (gzip), 2 (zstd) or 3 (lz4)")


def _too_large(codec: int, max_bytes: int, claimed: int | None = None):
    what = f"claims {claimed} bytes" if claimed is not None else f"inflates past {max_bytes} bytes"
    return InflatedSizeTooLargeError(
        f"{CODEC_NAMES[codec]} wrapper {what}, more than the limit of {max_bytes} bytes "
        f"for a decompressed message set (the topic's max_inflated_bytes); send smaller "
        f"compressed batches",
        limit=max_bytes,
    )


def _bad_stream(codec: int, why: str):
    return InvalidMessageError(
        f"the value of a {CODEC_NAMES[codec]} wrapper message is not a valid "
        f"{CODEC_NAMES[codec]} stream ({why}); the producer sent a malformed batch"
    )


def _whole(codec: int, d, out: bytes) -> bytes:
    """``out`` when the decompressor ``d`` saw exactly one whole stream."""
    if not d.eof:
        raise _bad_stream(codec, "truncated")
    if d.unused_data:
        raise _bad_stream(codec, "trailing bytes")
    return out


def _zstd_within(data, max_bytes: int) -> None:
    """Raise :class:`InflatedSizeTooLargeError` when the zstd frame ``data``
    (of no declared size) inflates past ``max_bytes``: its output is counted
    chunk by chunk and dropped, so no more than one chunk is held."""
    total = 0
    try:
        for chunk in _zstd_decompressor().read_to_iter(data, write_size=ZSTD_CHUNK_BYTES):
            total += len(chunk)
            if total > max_bytes:
                raise _too_large(CODEC_ZSTD, max_bytes)
    except zstandard.ZstdError as err:
        raise _bad_stream(CODEC_ZSTD, str(err)) from None


def decompress(codec: int, data, max_bytes: int, *, sized_only: bool = True) -> bytes:
    """Decompress a wrapper's value, refusing output larger than ``max_bytes``.

    ``sized_only``: a zstd frame must declare its content size (raylog's
    own wrappers always do); False takes one that does not too (Kafka
    batches of the Java producer), inflated with the counting pass first.

    Raises :class:`InflatedSizeTooLargeError` (a subclass of
    :class:`MessageTooLargeError`; nothing past ``max_bytes`` is inflated)
    or :class:`InvalidMessageError` for a stream that is truncated, has
    trailing bytes or is not of the codec.
    """
    if codec == CODEC_GZIP:
        d = zlib.decompressobj(31)
        try:
            out = d.decompress(data, max_bytes + 1)
        except zlib.error as err:
            raise _bad_stream(codec, str(err)) from None
        if len(out) > max_bytes:
            raise _too_large(codec, max_bytes)
        return _whole(codec, d, out)
    if codec == CODEC_ZSTD:
        try:
            claimed = zstandard.frame_content_size(data)
        except zstandard.ZstdError as err:
            raise _bad_stream(codec, str(err)) from None
        if claimed > max_bytes:
            raise _too_large(codec, max_bytes, claimed)
        if claimed < 0:
            if sized_only:
                raise _bad_stream(codec, "the frame does not declare its content size")
            _zstd_within(data, max_bytes)
        d = _zstd_decompressor().decompressobj()
        try:
            out = d.decompress(data)
        except zstandard.ZstdError as err:
            raise _bad_stream(codec, str(err)) from None
        return _whole(codec, d, out)
    if codec == CODEC_LZ4:
        d = lz4.frame.LZ4FrameDecompressor()
        try:
            out = d.decompress(data, max_length=max_bytes + 1)
        except RuntimeError as err:
            raise _bad_stream(codec, str(err)) from None
        if len(out) > max_bytes:
            raise _too_large(codec, max_bytes)
        return _whole(codec, d, out)
    if codec == CODEC_NONE:
        return bytes(data)
    raise InvalidMessageError(f"unknown codec id {codec}")


# --------------------------------------------------------------------------
# snappy (format 2 only)

SNAPPY_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = SNAPPY_XERIAL_MAGIC + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")
#: the uncompressed bytes per block of the xerial framing (Java's SnappyOutputStream default)
SNAPPY_XERIAL_BLOCK = 32 * 1024


def snappy_compress(data) -> bytes:
    """``data`` as a xerial-framed snappy stream (what Kafka's Java client writes)."""
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), SNAPPY_XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + SNAPPY_XERIAL_BLOCK]))
        parts.append(len(block).to_bytes(4, "big"))
        parts.append(block)
    return b"".join(parts)


def _snappy_error(why: str) -> InvalidMessageError:
    return InvalidMessageError(
        f"the records of a snappy batch are not a valid snappy stream ({why}); the producer sent a malformed batch"
    )


def _snappy_too_large(max_bytes: int, claimed: int) -> InflatedSizeTooLargeError:
    return InflatedSizeTooLargeError(
        f"snappy records claim at least {claimed} bytes, more than the limit of {max_bytes} bytes for "
        f"decompressed records (the topic's max_inflated_bytes); send smaller compressed batches",
        limit=max_bytes,
    )


def _snappy_block(block, budget: int, max_bytes: int, before: int) -> bytes:
    """One raw snappy block, its declared length checked against ``budget`` first."""
    try:
        claimed = cramjam.snappy.decompress_raw_len(block)
    except Exception as err:  # cramjam raises its own DecompressionError
        raise _snappy_error(f"bad length preamble: {err}") from None
    if claimed > budget:
        raise _snappy_too_large(max_bytes, before + claimed)
    try:
        out = bytes(cramjam.snappy.decompress_raw(block))
    except Exception as err:
        raise _snappy_error(str(err)) from None
    if len(out) != claimed:
        raise _snappy_error(f"a block declares {claimed} bytes but holds {len(out)}")
    return out


def snappy_decompress(data, max_bytes: int) -> bytes:
    """Decompress xerial-framed or raw snappy, refusing output past ``max_bytes``.

    Every block's declared length is checked before the block is inflated, so
    nothing larger than ``max_bytes`` is allocated. Raises
    :class:`InflatedSizeTooLargeError` or :class:`InvalidMessageError` (cut
    framing, a block that is not snappy, a block longer than it declares).
    """
    view = memoryview(data).cast("B")
    if bytes(view[:8]) != SNAPPY_XERIAL_MAGIC:
        return _snappy_block(view, max_bytes, max_bytes, 0)
    if len(view) < 16:
        raise _snappy_error("the xerial header is cut")
    parts: list[bytes] = []
    total = 0
    pos = 16
    while pos < len(view):
        if len(view) - pos < 4:
            raise _snappy_error("a xerial block length is cut")
        length = int.from_bytes(view[pos : pos + 4], "big")
        pos += 4
        if length > len(view) - pos or length & 0x80000000:
            raise _snappy_error(f"a xerial block claims {length} bytes, more than remain")
        out = _snappy_block(view[pos : pos + length], max_bytes - total, max_bytes, total)
        total += len(out)
        parts.append(out)
        pos += length
    return b"".join(parts)


# --------------------------------------------------------------------------
# zstd frames that do not declare their size (format 2 only)


def zstd_decompress_unsized(data, max_bytes: int) -> bytes:
    """Decompress one zstd frame that may not declare its content size (Kafka's
    Java client streams zstd and writes none), refusing output past ``max_bytes``.

    A bounded read (``max_bytes + 1`` bytes of output at most) finds the size
    first; only a frame within the bound is then inflated whole, to check that
    it is one complete frame with nothing after it. Raises
    :class:`InflatedSizeTooLargeError` or :class:`InvalidMessageError`.
    """
    try:
        reader = _zstd_decompressor().stream_reader(bytes(data), read_across_frames=False)
        head = reader.read(max_bytes + 1)
    except zstandard.ZstdError as err:
        raise _bad_stream(CODEC_ZSTD, str(err)) from None
    if len(head) > max_bytes:
        raise _too_large(CODEC_ZSTD, max_bytes)
    d = _zstd_decompressor().decompressobj()
    try:
        out = d.decompress(data)  # bounded: the same frame gave at most max_bytes above
    except zstandard.ZstdError as err:
        raise _bad_stream(CODEC_ZSTD, str(err)) from None
    return _whole(CODEC_ZSTD, d, out)


# --------------------------------------------------------------------------
# lz4 as Kafka writes it (format 2 only)


def lz4_compress_kafka(data) -> bytes:
    """``data`` as one lz4 frame the way Kafka's Java client writes it and its
    reader requires: independent blocks (it refuses linked ones) of at most
    64 KiB, no content size, no content checksum. Read back by
    :func:`decompress` (``CODEC_LZ4``), bounded by its output limit."""
    return lz4.frame.compress(
        data,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        store_size=False,
    )
