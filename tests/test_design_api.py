"""docs/design.md section 5's public API block (docs/design.md), run statement by statement.

The block is a listing, not a script: it connects three ways, deletes the
topic it then writes to, loops forever and leaves ``ray``, ``spark``,
``offset``, ``ckpt`` and ``out`` to the reader. So the test runs its lines as
written, in order, and only binds those names, recreates the topic after the
delete, leaves the consumer's loop after one message and skips the
existing-cluster ``connect`` (an address of the reader's); the stream,
which starts at the latest offsets, is then sent two messages. The lines
are read from docs/design.md each run, so the block as it stands is what runs.
The script runs in a fresh interpreter (its own Ray, ZooKeeper and Spark)
and must leave nothing running.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re

import pytest

from tests.doc_blocks import run_example

pytestmark = pytest.mark.timeout(900)

DESIGN = pathlib.Path(__file__).resolve().parents[1] / "docs" / "design.md"

_EXISTING_CLUSTER = 'client = raylog.connect(zookeeper="host:2181", ray_address="auto")'


def design_api_block() -> str:
    text = DESIGN.read_text()
    section = text[text.index("## 5. Public API") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _script(block: str, tmp_path) -> str:
    """The block's lines with the bindings it leaves to the reader."""
    out = ["import json", "import ray"]
    for line in block.splitlines():
        code = line.split("  #", 1)[0].rstrip()  # without its comment
        if code == "client = raylog.connect()":
            out += [code, "client.close()  # the next line connects anew"]
        elif code.startswith("client = raylog.connect(data_dir="):
            out.append(code.replace('"/tmp/rl"', repr(str(tmp_path / "rl"))))
        elif code == _EXISTING_CLUSTER:
            continue  # an existing cluster's address: connect(zookeeper=..., ray_address=...) is tested elsewhere
        elif code.endswith('client.delete_topic("clicks")'):
            out += [code, 'assert "clicks" not in client.list_topics()',
                    'client.create_topic("clicks", partitions=8, retention_ms=7*24*3600*1000)']
        elif code.strip().startswith("msg.topic, msg.partition"):
            out += [code, "    first = msg", "    break", "offset = first.offset"]
        elif code.startswith("consumer.poll("):
            out += [f"polled = {s.strip()}" if s.strip().startswith("consumer.poll(") else s.strip()
                    for s in code.split(";")]
        elif code.startswith("import raylog_spark"):
            out += [code, 'spark = raylog_spark.init_spark(app_name="design-api", num_executors=1, executor_cores=1)',
                    f"ckpt = {str(tmp_path / 'ckpt')!r}", f"out = {str(tmp_path / 'out')!r}"]
        else:
            out.append(code)
    assert "for msg in consumer:" in out and "offset = first.offset" in out, "the block's consumer loop changed"
    out += [
        # a stream starts at the latest offsets (Spark's Kafka source's default): it gets what comes after
        "q.processAllAvailable()",
        "more = client.producer(acks='all')",
        "more.send('clicks', b'after-start'); more.send('clicks', b'after-start-2'); more.flush(); more.close()",
        "q.processAllAvailable(); q.stop()",
        "result = {",
        "    'first': [first.topic, first.partition, first.offset, first.key and first.key.decode(), first.value.decode()],",
        "    'polled': sorted(m.value.decode() for m in polled),",
        "    'schema': [[f.name, f.dataType.simpleString()] for f in df.schema.fields],",
        "    'read_topic_rows': raylog_spark.read_topic(spark, 'clicks', starting_offsets='earliest',"
        " ending_offsets='latest').count(),",
        "    'by_name_rows': df.count(),",
        "    'streamed': sorted(bytes(r.value).decode() for r in spark.read.parquet(out).select('value').collect()),",
        "}",
        "raylog_spark.stop_spark()",
        "client.close()",
        "print('RESULT ' + json.dumps(result))",
    ]
    script = "\n".join(out) + "\n"
    ast.parse(script)
    return script


def test_design_section_5_runs_statement_by_statement(tmp_path):
    script = _script(design_api_block(), tmp_path)
    proc = run_example(script, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    # three messages: "value" keyed by user-42, then v1 and v2 from the producer actor
    topic, partition, offset, key, value = result["first"]
    assert topic == "clicks" and 0 <= partition < 8 and offset == 0  # a partition's first message
    assert (key, value) in (("user-42", "value"), (None, "v1"), (None, "v2"))
    # the poll's long-poll may end before every partition has answered: what it gives is the rest, once each
    assert len(set(result["polled"])) == len(result["polled"])
    assert set(result["polled"]) <= {"v1", "v2", "value"} - {value}
    # the documented columns, in the documented order and types
    assert result["schema"][:6] == [["key", "binary"], ["value", "binary"], ["topic", "string"],
                                    ["partition", "int"], ["offset", "bigint"], ["timestamp", "timestamp"]]
    # the batch reads plan when they run: all five messages; the stream: the two sent after it started
    assert (result["read_topic_rows"], result["by_name_rows"]) == (5, 5), result
    assert result["streamed"] == ["after-start", "after-start-2"], result
