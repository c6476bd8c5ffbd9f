"""Fixtures shared by the storage tests."""

import pytest

#: every codec a message set can be written with; suites run against each
COMPRESSIONS = [None, "gzip", "zstd", "lz4"]


@pytest.fixture(params=COMPRESSIONS, ids=lambda c: c or "none")
def compression(request):
    return request.param
