"""Codecs of wrapper messages: round trips and bounded decompression."""

import os

import pytest

from raylog.errors import ConfigError, InvalidMessageError, MessageTooLargeError
from raylog.storage.compression import CODEC_NAMES, CODECS, codec_id, compress, decompress

from conftest import COMPRESSIONS


@pytest.mark.parametrize("size", [0, 1, 1000, 300_000])
def test_every_codec_round_trips(compression, size):
    codec = codec_id(compression)
    data = os.urandom(size // 2) + b"\0" * (size - size // 2)
    assert decompress(codec, compress(codec, data), size) == data


@pytest.mark.parametrize("compression", COMPRESSIONS[1:])
def test_output_limit(compression):
    codec = codec_id(compression)
    packed = compress(codec, b"a" * 10_000)
    with pytest.raises(MessageTooLargeError):
        decompress(codec, packed, 9_999)
    with pytest.raises(InvalidMessageError):
        decompress(codec, b"\x00\x01garbage", 100)


def test_names():
    assert set(CODECS) == {None, "none", "gzip", "zstd", "lz4"}
    assert [CODEC_NAMES[codec_id(c)] for c in COMPRESSIONS] == ["none", "gzip", "zstd", "lz4"]
    with pytest.raises(ConfigError):
        codec_id("GZIP")
    with pytest.raises(ConfigError):
        compress(9, b"")
