"""Replies of the data channel: encoders (server side) and error decoding
(client side); the frames are defined field by field in
:mod:`raylog.transfer.protocol`."""

from __future__ import annotations

import json
import struct

from raylog.errors import ProtocolError, RaylogError, error_for_code
from raylog.transfer.protocol import (
    MAX_STRING_BYTES,
    SIZE,
    STRING_LENGTH,
    REPLY_HEADER,
    REPLY_HEADER_BODY,
    PRODUCE_REPLY,
    FETCH_REPLY,
    FETCH_V1_REPLY,
    FETCH_V1_ABORTED,
    FETCH_V1_DATA_LENGTH,
    OFFSETS_REPLY,
    OFFSETS_FOR_TIME_REPLY,
    COUNT_REPLY,
    LOCATE_REPLY,
    LOCATE_V1_REPLY_TAIL,
    REPLICA_FETCH_REPLY,
    REPLICA_FETCH_DATA_LENGTH,
    AUTH_HELLO_REPLY,
)


def encode_auth_reply(correlation_id: int) -> bytes:
    """The reply to an accepted AUTH PROOF."""
    return REPLY_HEADER.pack(REPLY_HEADER_BODY, correlation_id, 0)


def encode_auth_hello_reply(correlation_id: int, server_nonce: bytes, server_proof: bytes) -> bytes:
    """The reply to an AUTH HELLO: the server's nonce and proof."""
    return AUTH_HELLO_REPLY.pack(AUTH_HELLO_REPLY.size - SIZE.size, correlation_id, 0, server_nonce, server_proof)


def encode_produce_reply(correlation_id: int, base_offset: int) -> bytes:
    return PRODUCE_REPLY.pack(PRODUCE_REPLY.size - SIZE.size, correlation_id, 0, base_offset)


def encode_fetch_reply_header(correlation_id: int, high_watermark: int, log_start_offset: int, length: int) -> bytes:
    """The FETCH reply up to its data; ``length`` bytes of log follow."""
    return FETCH_REPLY.pack(
        FETCH_REPLY.size - SIZE.size + length, correlation_id, 0, high_watermark, log_start_offset, length
    )


def encode_fetch_v1_reply_header(correlation_id: int, high_watermark: int, log_start_offset: int,
                                 last_stable_offset: int, aborted, length: int) -> bytes:
    """The FETCH version 1 reply up to its data (the ``aborted``
    transactions, ``(producer id, first offset, last offset)`` each,
    included); ``length`` bytes of log follow."""
    entries = b"".join(FETCH_V1_ABORTED.pack(pid, first, last) for pid, first, last in aborted)
    return FETCH_V1_REPLY.pack(
        FETCH_V1_REPLY.size - SIZE.size + len(entries) + FETCH_V1_DATA_LENGTH.size + length,
        correlation_id, 0, high_watermark, log_start_offset, last_stable_offset, len(aborted),
    ) + entries + FETCH_V1_DATA_LENGTH.pack(length)


def encode_replica_fetch_reply_header(correlation_id: int, high_watermark: int, log_start_offset: int,
                                     leader_epoch: int, sets: bytes, length: int) -> bytes:
    """The REPLICA_FETCH reply up to its data (the producers' ``sets``
    included); ``length`` bytes of log follow."""
    return REPLICA_FETCH_REPLY.pack(
        REPLICA_FETCH_REPLY.size - SIZE.size + len(sets) + REPLICA_FETCH_DATA_LENGTH.size + length,
        correlation_id, 0, high_watermark, log_start_offset, leader_epoch, len(sets),
    ) + sets + REPLICA_FETCH_DATA_LENGTH.pack(length)


def encode_offsets_reply(correlation_id: int, log_start_offset: int, high_watermark: int) -> bytes:
    return OFFSETS_REPLY.pack(OFFSETS_REPLY.size - SIZE.size, correlation_id, 0, log_start_offset, high_watermark)


def encode_offsets_for_time_reply(correlation_id: int, offset: int) -> bytes:
    return OFFSETS_FOR_TIME_REPLY.pack(OFFSETS_FOR_TIME_REPLY.size - SIZE.size, correlation_id, 0, offset)


def encode_count_reply(correlation_id: int, messages: int, next_offset: int) -> bytes:
    return COUNT_REPLY.pack(COUNT_REPLY.size - SIZE.size, correlation_id, 0, messages, next_offset)


def encode_locate_reply(
    correlation_id: int, high_watermark: int, log_start_offset: int, kind: int, next_offset: int,
    position: int = 0, length: int = 0, device: int = 0, inode: int = 0, path: str = "",
) -> bytes:
    """A LOCATE reply; ``path`` the segment file's (empty for kind 1)."""
    raw = path.encode("utf-8")
    if len(raw) > MAX_STRING_BYTES:
        raise ProtocolError(f"a segment path of {len(raw)} bytes does not fit a LOCATE reply; use a shorter data_dir")
    return LOCATE_REPLY.pack(
        LOCATE_REPLY.size - SIZE.size + STRING_LENGTH.size + len(raw), correlation_id, 0, high_watermark,
        log_start_offset, kind, next_offset, position, length, device, inode,
    ) + STRING_LENGTH.pack(len(raw)) + raw


def encode_locate_v1_reply(version0: bytes, last_stable_offset: int, aborted) -> bytes:
    """A LOCATE version 1 reply: the version 0 reply ``version0``
    (:func:`encode_locate_reply`, its size field rewritten) followed by the
    last stable offset and the ``aborted`` transactions."""
    tail = LOCATE_V1_REPLY_TAIL.pack(last_stable_offset, len(aborted)) + b"".join(
        FETCH_V1_ABORTED.pack(pid, first, last) for pid, first, last in aborted)
    (size,) = SIZE.unpack_from(version0)
    return SIZE.pack(size + len(tail)) + version0[SIZE.size:] + tail


def _clip_utf8(raw: bytes, limit: int) -> bytes:
    if len(raw) <= limit:
        return raw
    return raw[:limit].decode("utf-8", "ignore").encode("utf-8")


def encode_error(correlation_id: int, error: BaseException) -> bytes:
    """An error reply carrying ``error``'s code, message and details."""
    if isinstance(error, RaylogError):
        code, details = error.code, dict(error.details)
    else:
        code, details = RaylogError.code, {}
    details.pop("correlation_id", None)
    message = _clip_utf8(str(error).encode("utf-8", "replace"), MAX_STRING_BYTES)
    raw = json.dumps(details, default=str, separators=(",", ":")).encode("utf-8")
    if len(raw) > MAX_STRING_BYTES:
        raw = b"{}"
    body = STRING_LENGTH.pack(len(message)) + message + STRING_LENGTH.pack(len(raw)) + raw
    return REPLY_HEADER.pack(REPLY_HEADER_BODY + len(body), correlation_id, code) + body


#: names a detail may not take: they would shadow the error's own attributes
_RESERVED_DETAILS = frozenset({"message", "code", "retriable", "details", "args"})


def decode_error(code: int, body) -> RaylogError:
    """Rebuild the typed raylog error from an error reply's body (the bytes
    after the reply header)."""
    body = memoryview(body)
    try:
        (length,) = STRING_LENGTH.unpack_from(body, 0)
        pos = STRING_LENGTH.size
        message = str(body[pos : pos + length], "utf-8", "replace")
        pos += length
        (length,) = STRING_LENGTH.unpack_from(body, pos)
        pos += STRING_LENGTH.size
        raw = bytes(body[pos : pos + length])
        details = json.loads(raw) if raw else {}
    except (struct.error, ValueError):
        return ProtocolError(f"malformed error reply (error code {code})", error_code=code)
    if not isinstance(details, dict):
        details = {}
    details = {str(k): v for k, v in details.items() if k not in _RESERVED_DETAILS}
    return error_for_code(code, message, **details)
