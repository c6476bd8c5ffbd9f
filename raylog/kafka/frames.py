"""The Kafka wire frames: size-prefixed requests in, responses out.

A request frame is ``size i32`` then ``size`` bytes: the request header
(api_key i16, api_version i16, correlation_id i32, client_id nullable
string; plus tagged fields in flexible versions) and the request body. A
response frame is ``size i32``, the response header (correlation_id i32;
plus tagged fields in flexible versions, never for ApiVersions) and the
body. The schemas of headers and bodies are kafka-python's
(``kafka.protocol``, generated from Kafka's own JSON message definitions);
this module only bounds, reads and dispatches.

:data:`SUPPORTED` lists the versions the listener serves, and so what
ApiVersions advertises. A request of another key or version, a frame larger
than the bound, or a body that does not decode is a :class:`BadFrame`: the
listener then closes the connection (what a Kafka broker does), except for
ApiVersions of a newer version, which is answered with UNSUPPORTED_VERSION
so the client retries with an older one.
"""

from __future__ import annotations

import io
import struct

from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    IncrementalAlterConfigsRequest,
    ListGroupsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetCommitRequest, OffsetFetchRequest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetDeleteRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

SIZE = struct.Struct(">i")
#: the largest request frame accepted (a produce of several 1 MiB batches)
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: the largest request frame accepted before SASL completes, on a listener
#: that requires it: what a client sends then (ApiVersions, SaslHandshake,
#: SaslAuthenticate or a bare SCRAM token) is a few hundred bytes
PRE_AUTH_MAX_REQUEST_BYTES = 16 * 1024

#: api key -> (request class, lowest and highest version served)
SUPPORTED = {
    ProduceRequest.API_KEY: (ProduceRequest, 3, 9),
    FetchRequest.API_KEY: (FetchRequest, 4, 12),
    ListOffsetsRequest.API_KEY: (ListOffsetsRequest, 1, 6),
    MetadataRequest.API_KEY: (MetadataRequest, 1, 9),
    # (0 and 1, without a retention time, are what sarama before 1.23 sends)
    OffsetCommitRequest.API_KEY: (OffsetCommitRequest, 0, 8),
    OffsetFetchRequest.API_KEY: (OffsetFetchRequest, 1, 6),
    FindCoordinatorRequest.API_KEY: (FindCoordinatorRequest, 0, 3),
    JoinGroupRequest.API_KEY: (JoinGroupRequest, 0, 6),
    HeartbeatRequest.API_KEY: (HeartbeatRequest, 0, 4),
    LeaveGroupRequest.API_KEY: (LeaveGroupRequest, 0, 4),
    SyncGroupRequest.API_KEY: (SyncGroupRequest, 0, 4),
    SaslHandshakeRequest.API_KEY: (SaslHandshakeRequest, 0, 1),
    ApiVersionsRequest.API_KEY: (ApiVersionsRequest, 0, 3),
    SaslAuthenticateRequest.API_KEY: (SaslAuthenticateRequest, 0, 1),
    InitProducerIdRequest.API_KEY: (InitProducerIdRequest, 0, 4),
    # transactions (raylog.kafka.transactions): Kafka's transaction version 1
    # (EndTxn 5, KIP-890's epoch bump per transaction, is not served)
    AddPartitionsToTxnRequest.API_KEY: (AddPartitionsToTxnRequest, 0, 3),
    AddOffsetsToTxnRequest.API_KEY: (AddOffsetsToTxnRequest, 0, 3),
    EndTxnRequest.API_KEY: (EndTxnRequest, 0, 4),
    TxnOffsetCommitRequest.API_KEY: (TxnOffsetCommitRequest, 0, 3),
    CreateTopicsRequest.API_KEY: (CreateTopicsRequest, 2, 5),
    DeleteTopicsRequest.API_KEY: (DeleteTopicsRequest, 1, 5),
    # (raylog.kafka.admin; 2 and 3 are flexible, with the same fields)
    CreatePartitionsRequest.API_KEY: (CreatePartitionsRequest, 0, 3),
    # (raylog.kafka.admin; 2 is flexible, with the same fields)
    DeleteRecordsRequest.API_KEY: (DeleteRecordsRequest, 0, 2),
    DescribeConfigsRequest.API_KEY: (DescribeConfigsRequest, 1, 4),
    AlterConfigsRequest.API_KEY: (AlterConfigsRequest, 0, 2),
    IncrementalAlterConfigsRequest.API_KEY: (IncrementalAlterConfigsRequest, 0, 1),
    # group administration (raylog.kafka.group_admin)
    ListGroupsRequest.API_KEY: (ListGroupsRequest, 0, 4),
    DescribeGroupsRequest.API_KEY: (DescribeGroupsRequest, 0, 5),
    DeleteGroupsRequest.API_KEY: (DeleteGroupsRequest, 0, 2),
    OffsetDeleteRequest.API_KEY: (OffsetDeleteRequest, 0, 0),
    # the cluster and its transactions (raylog.kafka.handlers, raylog.kafka.transaction_admin;
    # flexible versions only)
    DescribeClusterRequest.API_KEY: (DescribeClusterRequest, 0, 2),
    ListTransactionsRequest.API_KEY: (ListTransactionsRequest, 0, 1),
    DescribeTransactionsRequest.API_KEY: (DescribeTransactionsRequest, 0, 0),
    DescribeProducersRequest.API_KEY: (DescribeProducersRequest, 0, 0),
}

#: api key -> the lowest version ApiVersions advertises, where it is below
#: the lowest served: librdkafka before 2.11.1 turns its "MsgVer1" feature
#: off unless Produce 2 and Fetch 2 are advertised, and with it, without a
#: word, compression (its issue #4956; Kafka 4 keeps advertising them for
#: this reason). A request of such a version is refused as any version not
#: served is (the connection closes, saying why); clients use the highest
#: version both sides have, which is served.
ADVERTISED_LOWEST = {
    ProduceRequest.API_KEY: 0,
    FetchRequest.API_KEY: 0,
}

#: Kafka's error code for an unsupported version
UNSUPPORTED_VERSION = 35


def advertised_versions() -> list[tuple[int, int, int]]:
    """``(api key, lowest, highest)`` of every key ApiVersions names: the
    served versions of :data:`SUPPORTED`, the lowest as
    :data:`ADVERTISED_LOWEST` says where it says."""
    return [(key, ADVERTISED_LOWEST.get(key, low), high) for key, (_, low, high) in sorted(SUPPORTED.items())]
_HEAD = struct.Struct(">hhi")


class BadFrame(Exception):
    """A frame the listener does not serve; the connection is closed."""


class Request:
    """One decoded request: ``api_key``, ``version``, ``correlation_id``,
    ``client_id`` and ``body`` (a kafka-python request object)."""

    __slots__ = ("api_key", "version", "correlation_id", "client_id", "body")

    def __init__(self, api_key, version, correlation_id, client_id, body):
        self.api_key, self.version, self.correlation_id = api_key, version, correlation_id
        self.client_id, self.body = client_id, body


def uvarint(value: int) -> bytes:
    """Kafka's unsigned varint of ``value`` (>= 0): 7 bits a byte, least
    significant first, the high bit set on every byte but the last; what
    flexible versions count compact strings, bytes, arrays and tagged
    fields with."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def check_size(size: int, limit: int = MAX_REQUEST_BYTES) -> None:
    """Raise :class:`BadFrame` for a frame size outside ``_HEAD.size..limit``."""
    if size < _HEAD.size or size > limit:
        before = " before SASL authentication" if limit < MAX_REQUEST_BYTES else ""
        raise BadFrame(f"a request frame of {size} bytes{before} (accepted: {_HEAD.size}..{limit})")


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request frame's payload."""
    if len(frame) < _HEAD.size:
        raise BadFrame(f"a request of {len(frame)} bytes has no header")
    return _HEAD.unpack_from(frame)


def decode_request(frame: bytes) -> Request:
    """Decode a request frame's payload (without its size field)."""
    api_key, version, correlation_id = peek_header(frame)
    entry = SUPPORTED.get(api_key)
    if entry is None:
        raise BadFrame(f"api key {api_key} is not served")
    cls, low, high = entry
    if not low <= version <= high:
        raise BadFrame(f"api key {api_key} version {version} is not served (versions {low}..{high})"
                       + (" (the lower versions are advertised for old librdkafka's feature check only; "
                          "use a client that speaks a served version)" if version < low else ""))
    try:
        stream = io.BytesIO(frame)
        header = RequestHeader.decode(stream, flexible=cls.flexible_version_q(version))
        body = cls.decode(memoryview(frame)[stream.tell():], version=version)
    except MemoryError:
        raise BadFrame(f"a request of api key {api_key} claims more memory than its frame holds") from None
    except Exception as err:  # noqa: BLE001 - any decoding failure is a malformed frame
        raise BadFrame(f"a malformed request of api key {api_key} version {version}: {type(err).__name__}") from None
    return Request(api_key, version, correlation_id, header.client_id, body)


def encode_response(response, correlation_id: int) -> bytes:
    """The response frame (size included) of a kafka-python response object."""
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


def api_versions_response(version: int, correlation_id: int, error_code: int = 0) -> bytes:
    """The ApiVersions answer: every key of :data:`SUPPORTED` with its
    versions; ``error_code`` UNSUPPORTED_VERSION is encoded as version 0."""
    if error_code:
        version = 0
    keys = [ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, low, high in advertised_versions()]
    response = ApiVersionsResponse[version](error_code=error_code, api_keys=keys)
    return encode_response(response, correlation_id)
