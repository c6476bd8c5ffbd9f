"""Fixtures shared by the producer tests.

A module that sets ``BOTH_SEND_PATHS = True`` runs each of its tests
against both implementations of ``Producer.send``: ``c`` (the compiled
keyless case, ``raylog.producer._fastsend``, with the reference behind it)
and ``python`` (the reference alone). The ``c`` run is skipped when the
module is not built.
"""

import pytest

from raylog.producer import producer as producer_module

#: every implementation of Producer.send
SEND_PATHS = ["c", "python"]

try:
    from raylog.producer import _fastsend as FASTSEND
except ImportError:
    FASTSEND = None


def pytest_generate_tests(metafunc):
    if "send_path" in metafunc.fixturenames and getattr(metafunc.module, "BOTH_SEND_PATHS", False):
        metafunc.parametrize("send_path", SEND_PATHS, indirect=True)


@pytest.fixture(autouse=True)
def send_path(request, monkeypatch):
    """The implementation of send the producers of the test use (see the module docstring)."""
    path = getattr(request, "param", None)
    if path == "c" and FASTSEND is None:
        pytest.skip("raylog.producer._fastsend is not built")
    if path == "python":
        monkeypatch.setattr(producer_module, "_fastsend", None)
    return path
