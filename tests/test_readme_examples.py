"""The README's examples, run as written, print nothing but their own output
and leave nothing running. (The Spark block runs as written in
``tests/integrations/spark/test_readme.py``.)

Each example runs in a subprocess of its own (the embedded default starts a
Ray and a ZooKeeper of its own). Every process it starts inherits a marker
in its environment; after the example exits, no process may still carry it.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time
import uuid


README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
#: a bound on one example on a loaded machine; a hang is the failure
EXAMPLE_TIMEOUT_S = 600
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAY_ADDRESS", "RAYLOG_LOG_LEVEL")


def readme_block(heading: str, language: str = "python") -> str:
    """The first ``language`` code block after the line ``heading``."""
    text = README.read_text()
    assert heading in text, f"the README has no {heading!r}"
    section = text.split(heading, 1)[1]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def _marked_processes(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds ``marker``."""
    found = []
    needle = f"RAYLOG_TEST_MARKER={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def run_example(code: str, tmp_path, *, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` as a script in a fresh interpreter; assert that every
    process it started is gone within a few seconds of its exit."""
    script = tmp_path / "example.py"
    script.write_text(code)
    marker = uuid.uuid4().hex
    environment = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    environment.update(env or {})
    environment["RAYLOG_TEST_MARKER"] = marker
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            env=environment,
            cwd=str(tmp_path),
            timeout=EXAMPLE_TIMEOUT_S,
        )
    finally:
        deadline = time.monotonic() + 30
        left = _marked_processes(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = _marked_processes(marker)
        for pid in left:  # do not leave them to the other engineers' runs
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    assert not left, f"processes left running after the example exited: {left}"
    return proc


_MESSAGE_LINE = re.compile(r"^clicks \d+ \d+ (b'.*'|None) b'.*' \d+$")


def _assert_first_example_output(proc) -> None:
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all(_MESSAGE_LINE.match(line) for line in lines), proc.stdout
    assert sum("b'user-42'" in line for line in lines) == 1, proc.stdout  # the keyed message
    assert sum(" None b'v1' " in line for line in lines) == 1 and sum(" None b'v2' " in line for line in lines) == 1
    # Nothing but what the example prints: no Ray notices, no ZooKeeper
    # chatter, no stack traces at exit.
    assert proc.stderr == "", proc.stderr


def test_the_first_example_runs_as_written_with_clean_output(tmp_path):
    proc = run_example(readme_block("## Using it"), tmp_path)
    _assert_first_example_output(proc)


def test_a_client_left_open_is_closed_at_exit_silently(tmp_path):
    """The same example without ``with`` and without ``close()``: the
    interpreter's exit stops actors, ZooKeeper and Ray in order, quietly."""
    code = readme_block("## Using it")
    body = code.split("with raylog.connect() as client:", 1)
    assert len(body) == 2, "the first example no longer opens the client with 'with'"
    lines = body[1].splitlines()[1:]
    unindented = "\n".join(line[4:] if line.startswith("    ") else line for line in lines)
    script = body[0] + "client = raylog.connect()\n" + unindented + "\n"
    assert "close()" not in script
    proc = run_example(script, tmp_path)
    _assert_first_example_output(proc)


def test_verbose_brings_the_notices_back(tmp_path):
    """The control of the clean-output tests: a client whose ZooKeeper
    vanishes is quiet by default, and with RAYLOG_LOG_LEVEL=INFO lets
    kazoo's retry lines through."""
    code = (
        "from raylog import _log\n"
        "from raylog.client import Client\n"
        "from raylog.zk.server import EmbeddedZooKeeper\n"
        "_log.configure()  # what connect() and the CLI do\n"
        "server = EmbeddedZooKeeper().start()\n"
        "client = Client(zookeeper=server.connect_string)\n"
        "server.kill_process()\n"
        "import time; time.sleep(3)\n"
        "server.stop()\n"
    )
    quiet = run_example(code, tmp_path)
    loud = run_example(code, tmp_path, env={"RAYLOG_LOG_LEVEL": "INFO"})
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    assert "Connection dropped" not in quiet.stderr, quiet.stderr
    assert "Connection dropped" in loud.stderr, loud.stderr


def test_the_group_administration_example_runs_as_written(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    consumer = raylog_client.consumer(topic, group="analytics", auto_offset_reset="earliest")
    try:
        consumer.poll(timeout_ms=2000)
        consumer.commit()
        namespace = {"client": raylog_client}
        exec(compile(readme_block("### Group administration"), "README.md", "exec"), namespace)
    finally:
        consumer.close()
    assert "analytics" in raylog_client.list_groups()


def test_the_ray_data_example_runs_as_written(raylog_client, capsys):
    """The README's Ray Data block on the module's client, its topic
    "clicks" of two partitions holding 40 messages."""
    raylog_client.create_topic("clicks", partitions=2)
    producer = raylog_client.producer(acks="all")
    for i in range(40):
        producer.send("clicks", b"v%d" % i, key=b"k%d" % (i % 5))
    producer.flush()
    producer.close()
    namespace = {"client": raylog_client}
    exec(compile(readme_block("### Ray Data without Spark"), "README.md", "exec"), namespace)
    assert len(namespace["plan"].ranges) >= 4
    count, names = capsys.readouterr().out.splitlines()[-1].split(" ", 1)
    assert int(count) == 40
    assert eval(names) == ["key", "value", "topic", "partition", "offset", "timestamp"]


def test_the_quickstart_demo_runs_clean_and_stops_the_cluster(tmp_path):
    """``make demo`` (``python -m raylog.tools.demo``), smaller: its own lines
    only, ending with the cluster stopped. Its Spark step included: Spark's
    driver JVM writes Ray's ``gcs_client.cc`` start-up lines straight to
    stderr unless ``init_spark`` filters them. Three send calls per task, so more
    than one is in flight at a time."""
    assert "make demo" in readme_block("## Quickstart", "bash")
    code = "from raylog.tools.demo import main\nmain(['--tasks', '2', '--events-per-task', '12000'])\n"
    proc = run_example(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "gcs_client.cc" not in proc.stderr, proc.stderr
    assert proc.stderr == "", proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].endswith("cluster stopped."), proc.stdout
    assert "produced 24,000 events" in proc.stdout and "nothing lost" in proc.stdout
    assert "24,000 events\n" in proc.stdout.split("Spark: read_topic", 1)[1], proc.stdout
