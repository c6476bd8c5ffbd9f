"""The Ray Data example of docs/howto/spark.md prints its own output and none of Ray
Data's INFO lines (dataset start, execution plan, progress blocks), while
``RAYLOG_LOG_LEVEL=INFO`` brings them back; a warning of the application's
own still reaches stderr.

The example runs as written, in a subprocess with the embedded default
(a Ray of its own: Ray Data's logging is set up per process).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.doc_blocks import block

#: a bound on one run on a loaded machine; a hang is the failure
RUN_TIMEOUT_S = 600
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAY_ADDRESS",
             "RAYLOG_LOG_LEVEL")
#: the head of a line of Ray's Python loggers at INFO ("... INFO file.py:123 -- ...")
RAY_INFO_LINE = re.compile(r"\bINFO [\w./]+\.py:\d+ -- ")


def _ray_data_block() -> str:
    return block("docs/howto/spark.md", "Ray Data without Spark")


def _script() -> str:
    return "\n".join([
        "import logging",
        "import raylog",
        "client = raylog.connect(num_cpus=2)",
        "client.create_topic('clicks', partitions=2)",
        "producer = client.producer(acks='all')",
        "producer.send_batch('clicks', [b'%d' % i for i in range(40)]).result(timeout_s=120)",
        "producer.close()",
        _ray_data_block(),
        "logging.getLogger('app').warning('the application warns')",
        "client.close()",
    ])


def _run(**env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    environment.update(env)
    try:
        proc = subprocess.run([sys.executable, "-c", _script()], capture_output=True, text=True,
                              env=environment, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"still ran after {RUN_TIMEOUT_S} s: {hung.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines()[-1] == "40 ['key', 'value', 'topic', 'partition', 'offset', 'timestamp', 'headers']", proc.stdout
    return proc


def test_the_ray_data_example_prints_no_ray_data_info_lines():
    quiet = _run()
    assert not RAY_INFO_LINE.search(quiet.stderr), quiet.stderr
    assert quiet.stderr.splitlines() == ["the application warns"], quiet.stderr


def test_verbose_brings_ray_datas_info_lines_back():
    loud = _run(RAYLOG_LOG_LEVEL="INFO")
    assert re.search(r"INFO streaming_executor\.py:\d+ -- Starting execution of Dataset", loud.stderr), loud.stderr
