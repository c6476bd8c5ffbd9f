"""Request frames: what is served, what closes the connection (pure)."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest

from raylog.kafka.frames import (
    MAX_REQUEST_BYTES,
    SUPPORTED,
    BadFrame,
    api_versions_response,
    check_size,
    decode_request,
)


def test_api_versions_lists_what_is_served():
    payload = api_versions_response(3, 9)[4:]
    answer = ApiVersionsResponse.decode(payload[4:], version=3)
    assert struct.unpack_from(">i", payload)[0] == 9
    assert {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys} == {
        0: (0, 9), 1: (0, 12), 2: (1, 6), 3: (1, 9), 8: (0, 8), 9: (1, 6), 10: (0, 3),
        11: (0, 6), 12: (0, 4), 13: (0, 4), 14: (0, 4), 15: (0, 5), 16: (0, 4), 17: (0, 1), 18: (0, 3), 19: (2, 5),
        20: (1, 5), 21: (0, 2), 22: (0, 4), 24: (0, 3), 25: (0, 3), 26: (0, 4), 28: (0, 3), 32: (1, 4), 33: (0, 2), 36: (0, 1),
        37: (0, 3),
        42: (0, 2), 44: (0, 1), 47: (0, 0), 60: (0, 2), 61: (0, 0), 65: (0, 0), 66: (0, 1)}
    assert set(SUPPORTED) == {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 24, 25, 26, 28, 32, 33,
                              36, 37, 42, 44, 47, 60, 61, 65, 66}


def test_a_served_request_decodes():
    request = MetadataRequest[8](topics=[MetadataRequest.MetadataRequestTopic(name="t")], allow_auto_topic_creation=False,
                                 include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
    request.with_header(correlation_id=4, client_id="c")
    decoded = decode_request(bytes(request.encode(header=True)))
    assert (decoded.api_key, decoded.version, decoded.correlation_id) == (3, 8, 4)
    assert [t.name for t in decoded.body.topics] == ["t"]


@pytest.mark.parametrize("payload", [
    b"",
    b"\x00\x03",
    struct.pack(">hhih", 99, 0, 1, -1),          # not served
    struct.pack(">hhih", 3, 0, 1, -1),           # Metadata v0: not served
    struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", 2**31 - 1),  # an array larger than the frame
    struct.pack(">hhih", 0, 3, 1, 50) + b"x",    # a client id longer than the frame
])
def test_a_malformed_or_unserved_request_is_a_bad_frame(payload):
    with pytest.raises(BadFrame):
        decode_request(payload)


@pytest.mark.parametrize("size", [-1, 0, 7, MAX_REQUEST_BYTES + 1, 2**31 - 1])
def test_sizes_outside_the_bounds_are_refused_before_reading(size):
    with pytest.raises(BadFrame):
        check_size(size)


def test_the_package_docstring_lists_exactly_the_apis_and_versions_served():
    import re

    import raylog.kafka

    text = raylog.kafka.__doc__.split("Served", 1)[1].split(".\n", 1)[0]
    listed = {name: (int(low), int(high or low)) for name, low, high in re.findall(r"([A-Z][A-Za-z]+) (\d+)(?:-(\d+))?", text)}
    served = {cls.__name__.removesuffix("Request"): (low, high) for cls, low, high in SUPPORTED.values()}
    assert listed == served
