"""A ZooKeeper outage is reported once, from the client, and its end once:
no line per actor (kazoo's "Connection dropped" from every partition
actor's and the supervisor's session, nor the outage line of a client
held by an actor), no traceback (the supervisor's failed repair passes).

The embedded default runs in a subprocess whose stderr is counted; its
ZooKeeper is stopped and started again on the same port and data
(:func:`raylog.testing.faults.zookeeper_outage`). A message sent before
and one after the outage are both read back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

#: how long ZooKeeper stays down: longer than the sessions' timeout (10 s),
#: and several supervisor passes (5 s apart) fail meanwhile
OUTAGE_S = 15.0
#: the subprocess is killed after this (a hang is then a clear failure)
KILL_AFTER_S = 400.0
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAY_ADDRESS",
             "RAYLOG_LOG_LEVEL")

_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import raylog
    from raylog.config import EARLIEST
    from raylog.testing.faults import zookeeper_outage

    def mark(text):
        print("=== " + text, file=sys.stderr, flush=True)

    client = raylog.connect(num_cpus=4)
    client.create_topic("t", partitions=2, flush_ms=50)

    import ray

    @ray.remote(num_cpus=0)
    class Holder:  # a raylog client inside an actor: it says nothing of the outage
        def __init__(self, zookeeper, cluster):
            self.client = raylog.Client(zookeeper=zookeeper, cluster=cluster)

        def topics(self):
            return self.client.list_topics()

    holder = Holder.remote(client.settings.zookeeper, client.settings.cluster)
    assert ray.get(holder.topics.remote(), timeout=120) == ["t"]
    producer = client.producer()
    producer.send("t", b"before").result(timeout_s=60)
    time.sleep(6)  # a supervisor pass or more while all is well
    mark("OUTAGE")
    zookeeper_outage(client._owned_zookeeper, OUTAGE_S)
    mark("BACK")
    deadline = time.monotonic() + 120
    while True:  # until the partitions serve again (their endpoints re-registered)
        try:
            producer.send("t", b"after").result(timeout_s=60)
            break
        except raylog.RaylogError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    time.sleep(12)  # several supervisor passes after the recovery
    mark("READ")
    consumer = client.consumer("t", auto_offset_reset=EARLIEST)
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 2 and time.monotonic() < deadline:
        got.extend(m.value for m in consumer.poll(timeout_ms=500))
    consumer.close()
    print(sorted(got))
    client.close()
    """
)


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in _OUR_VARS}


def _between(lines: list[str], start: str, end: str | None) -> list[str]:
    """The lines after the mark ``start`` and before the mark ``end``."""
    first = lines.index(f"=== {start}") + 1
    last = lines.index(f"=== {end}") if end is not None else len(lines)
    return lines[first:last]


def test_a_zookeeper_outage_is_one_line_and_its_end_one_line():
    script = f"OUTAGE_S = {OUTAGE_S!r}\n" + _SCRIPT
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(),
                              timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"still ran after {KILL_AFTER_S:g} s: {hung.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "[b'after', b'before']", proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback (most recent call last):" not in proc.stderr, proc.stderr
    assert not any("Connection dropped" in line or "Transition to CONNECTING" in line for line in lines), proc.stderr
    # The outage's line comes during it; its end's line once the client is
    # back, which may be before the server's restart returns (BACK) or after.
    since = [line for line in _between(lines, "OUTAGE", None) if not line.startswith("===")]
    down = [line for line in since if "unreachable" in line]
    recovered = [line for line in since if "reachable again" in line]
    assert len(down) == 1 and "ZooKeeper at" in down[0], proc.stderr
    assert down[0] in _between(lines, "OUTAGE", "BACK"), proc.stderr
    assert len(recovered) == 1 and since.index(recovered[0]) > since.index(down[0]), proc.stderr
    assert [line for line in since if line not in down + recovered] == [], proc.stderr
    assert lines[: lines.index("=== OUTAGE")] == [], proc.stderr  # a quiet start
