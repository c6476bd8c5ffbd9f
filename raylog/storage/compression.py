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

Thread-safety: every function may be called from any thread; codec contexts
that are not thread-safe (zstd) are kept per thread.
"""

from __future__ import annotations

import threading
import zlib

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
