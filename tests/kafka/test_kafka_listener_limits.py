"""The listener's connection bound and the process's open files: the soft
RLIMIT_NOFILE is raised to the hard limit when a listener starts, and the
connections served are bounded by it less the listener's headroom (run in
a child process, whose limits the test sets)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import resource, sys
    from raylog.kafka.listener import connection_limit, fd_headroom
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
    print(connection_limit(int(sys.argv[3])), resource.getrlimit(resource.RLIMIT_NOFILE)[0], fd_headroom(1024))
""")


def _limit(soft: int, hard: int, wanted: int) -> tuple[int, int, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(soft), str(hard), str(wanted)], check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


@pytest.fixture
def hard() -> int:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 8192:
        pytest.skip(f"the hard open files limit is {hard}; the test lowers it from 8,192")
    return 8192


def test_the_soft_limit_is_raised_to_the_hard_one_and_bounds_the_connections(hard):
    served, soft_after, _ = _limit(1024, hard, 10_000)
    assert soft_after == hard
    assert served == hard - hard // 4  # a quarter kept for the listener's own files


def test_a_low_hard_limit_lowers_the_bound_and_a_high_one_keeps_the_default(hard):
    served, soft_after, headroom = _limit(1024, 1024, 10_000)
    assert soft_after == 1024 and served == 1024 - headroom == 512
    assert _limit(1024, hard, 100)[0] == 100  # below what the files allow: as asked
