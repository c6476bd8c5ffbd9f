"""The README's examples, and those of the docs pages it leads to (Getting
started, Consumer groups, Spark and Ray Data), run as written, print nothing
but their own output and leave nothing running. (The Spark block runs as
written in ``tests/integrations/spark/test_readme.py``; the list of every
code block and the test that runs it is in ``tests/test_docs_site.py``.)

Each example runs in a subprocess of its own (the embedded default starts a
Ray and a ZooKeeper of its own). Every process it starts inherits a marker
in its environment; after the example exits, no process may still carry it
(:func:`tests.doc_blocks.run_example`).
"""

from __future__ import annotations

import re

from tests.doc_blocks import block, printed_lines, run_example


def readme_block(heading: str, language: str = "python") -> str:
    """The first ``language`` code block under the README's ``heading`` (e.g. "## Using it")."""
    return block("README.md", heading.lstrip("#").strip(), language)


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


def test_the_readme_and_getting_started_show_the_same_first_example_and_commands():
    """The front page's example and commands are Getting started's, word for
    word, so the runs of the README's blocks here run the page's too."""
    assert readme_block("## Using it") == block("docs/index.md", "Using it")
    assert readme_block("## Quickstart", "bash") == block("docs/index.md", "Quickstart", "bash")


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
        "from raylog import quiet\n"
        "from raylog.client import Client\n"
        "from raylog.zk.server import EmbeddedZooKeeper\n"
        "quiet.configure()  # what connect() and the CLI do\n"
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
        exec(compile(block("docs/howto/groups.md", "Group administration"), "groups.md", "exec"), namespace)
    finally:
        consumer.close()
    assert "analytics" in raylog_client.list_groups()


def test_the_ray_data_example_runs_as_written(raylog_client, capsys):
    """The Ray Data block (docs/howto/spark.md) on the module's client, its topic
    "clicks" of two partitions holding 40 messages."""
    raylog_client.create_topic("clicks", partitions=2)
    producer = raylog_client.producer(acks="all", batch_size=5)  # several record batches: reads cut at their starts
    for i in range(40):
        producer.send("clicks", b"v%d" % i, key=b"k%d" % (i % 5))
    producer.flush()
    producer.close()
    namespace = {"client": raylog_client}
    exec(compile(block("docs/howto/spark.md", "Ray Data without Spark"), "spark.md", "exec"), namespace)
    assert len(namespace["plan"].ranges) >= 4
    count, names = printed_lines(capsys.readouterr().out)[-1].split(" ", 1)
    assert int(count) == 40
    assert eval(names) == ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]


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


def test_the_consumer_pool_example_runs_as_written(tmp_path):
    """The README's "Consumer apps on Ray": a pool of two members catches
    up with the topic, prints only its own line, and leaves nothing running."""
    proc = run_example(readme_block("## Consumer apps on Ray"), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "2 members, lag in messages: [0, 0, 0, 0]\n", proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr


def test_the_streaming_ray_data_example_runs_as_written(raylog_client, capsys):
    """The README's "Streaming Ray Data" block on the module's client, its
    topic "events" of two partitions holding 30 messages: one micro-batch
    (or more) of 30 rows written, then the idle timeout; the group committed the end."""
    import shutil

    from raylog.read import offset_store

    raylog_client.create_topic("events", partitions=2, flush_ms=10)
    producer = raylog_client.producer(acks="all")
    for i in range(30):
        producer.send("events", b"e%d" % i, key=b"k%d" % (i % 3))
    producer.flush()
    producer.close()
    namespace = {"client": raylog_client}
    try:
        exec(compile(block("README.md", "Streaming Ray Data"), "README.md", "exec"), namespace)
    finally:
        if "out" in namespace:
            shutil.rmtree(namespace["out"], ignore_errors=True)
    last = printed_lines(capsys.readouterr().out)[-1]  # one batch, or more if a flush came late
    assert re.fullmatch(r"30 rows written; batches: [1-9]\d*", last), last
    committed = offset_store(raylog_client.metadata).committed_all("events-to-parquet")
    assert committed == {("events", p): end for p, end in raylog_client.end_offsets("events").items()}


def test_the_kafka_clients_example_runs_as_written(tmp_path):
    """librdkafka produces through the Kafka listener and reads back, in a
    cluster of the example's own."""
    proc = run_example(readme_block("## Kafka clients"), tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "b'user-42' b'/'", "b'user-42' b'/cart'", "b'user-42' b'/pay'"], proc.stdout
    offsets = [int(line.split(" ", 1)[0]) for line in lines]
    assert offsets == sorted(set(offsets))
    # its Kafka clients are closed inside the block: none outlives the
    # cluster and tells of refused connections to its stopped listener
    assert "Connection refused" not in proc.stderr, proc.stderr
    assert proc.stderr == "", proc.stderr
