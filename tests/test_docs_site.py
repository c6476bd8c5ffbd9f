"""The documentation site (mkdocs.yml, docs/): it builds with warnings as
errors, its generated references cover the commands and the public API, and
every code block of its pages and of the README is run by a test.

:data:`BLOCKS` lists every fenced block of ``README.md`` and ``docs/**/*.md``
by page, heading and place under the heading, with the test that runs it:
a test of this module (``here: <name>``), a test elsewhere (its node id), or
``not run: <why>``. A block that is not run carries the language tag
``text`` (and only such a block does), so a reader sees at once which
commands were not executed. A new block without an entry, an entry without a
block, or a ``text`` block run nowhere fails
:func:`test_every_code_block_is_run_by_a_test_or_listed_as_not_run`.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import uuid

import pytest

from tests.doc_blocks import REPO, all_blocks, block, blocks_of, pages, run_example

pytestmark = pytest.mark.timeout(900)

HERE = "here: "
NOT_RUN = "not run: "

#: every code block of the README and the docs pages, and what runs it
BLOCKS: dict[tuple[str, str, int], str] = {
    # -- the front page (its blocks are Getting started's, word for word) ----
    ("README.md", "Quickstart", 0): HERE + "test_the_quickstart_commands_are_make_targets",
    ("README.md", "Using it", 0):
        "tests/test_readme_examples.py::test_the_first_example_runs_as_written_with_clean_output",
    # -- Getting started -----------------------------------------------------
    ("docs/index.md", "Quickstart", 0): HERE + "test_the_quickstart_commands_are_make_targets",
    ("docs/index.md", "Using it", 0):
        "tests/test_readme_examples.py::test_the_readme_and_getting_started_show_the_same_first_example_and_commands",
    # -- How-to --------------------------------------------------------------
    ("docs/howto/produce-consume.md", "Producing: futures, acks, idempotence", 0):
        "tests/producer/test_producer.py::test_the_readme_producing_example_runs_as_written",
    ("docs/howto/spark.md", "Spark and Ray Data", 0):
        "tests/integrations/spark/test_readme.py::test_the_readme_spark_example_runs_as_written",
    ("docs/howto/spark.md", "Avro columns: from_avro and to_avro", 0):
        "tests/integrations/spark/test_spark_avro_functions.py::test_the_avro_functions_example_runs_as_written",
    ("docs/howto/spark.md", "Ray Data without Spark", 0):
        "tests/test_readme_examples.py::test_the_ray_data_example_runs_as_written",
    ("docs/howto/spark.md", "Topics written in transactions", 0):
        "tests/integrations/spark/test_spark_read_committed.py::test_the_read_committed_example_runs_as_written",
    ("docs/howto/spark.md", "Compacted topics and the table view", 0):
        "tests/read/test_read_compacted.py::test_the_table_view_example_runs_as_written",
    ("docs/howto/spark.md", "The table view in Spark", 0):
        "tests/integrations/spark/test_spark_compacted.py::test_the_spark_table_view_example_runs_as_written",
    ("docs/howto/groups.md", "Consumer groups: the commit rule", 0):
        HERE + "test_the_corrupt_message_snippet_skips_a_damaged_message",
    ("docs/howto/groups.md", "Group administration", 0):
        "tests/test_readme_examples.py::test_the_group_administration_example_runs_as_written",
    ("README.md", "Consumer apps on Ray", 0):
        "tests/test_readme_examples.py::test_the_consumer_pool_example_runs_as_written",
    ("README.md", "Exactly once: consume, transform, produce", 0):
        "tests/pool/test_pool_exactly_once.py::test_the_readme_exactly_once_example_runs_as_written",
    ("README.md", "Streaming Ray Data", 0):
        "tests/test_readme_examples.py::test_the_streaming_ray_data_example_runs_as_written",
    ("docs/howto/kafka.md", "Topics created on first use", 0):
        "tests/kafka/test_kafka_docs_page.py::test_the_topics_created_on_first_use_block_runs_as_written",
    ("docs/howto/kafka.md", "confluent-kafka", 0):
        "tests/kafka/test_kafka_docs_page.py::test_the_confluent_kafka_block_runs_as_written",
    ("docs/howto/kafka.md", "kafka-python", 0):
        "tests/kafka/test_kafka_docs_page.py::test_the_kafka_python_block_runs_as_written",
    ("docs/howto/kafka.md", "aiokafka", 0):
        "tests/kafka/test_kafka_docs_page.py::test_the_aiokafka_block_runs_as_written",
    ("docs/howto/kafka.md", "KafkaJS", 0):
        NOT_RUN + "a Node.js fragment; tests/kafka/test_kafka_kafkajs.py runs these settings (kafkajs/headers.js)",
    ("docs/howto/kafka.md", "kcat", 0):
        NOT_RUN + "placeholders for the address, cluster and token; tests/kafka/test_kafka_kcat.py runs kcat so",
    ("docs/howto/kafka.md", "sarama (Go)", 0):
        NOT_RUN + "a Go fragment with placeholders; tests/kafka/test_kafka_sarama.py builds and runs "
                  "apps/sarama/main.go, which holds it whole",
    ("docs/howto/kafka.md", "TLS (SASL_SSL)", 0):
        "tests/kafka/test_kafka_tls.py::test_the_tls_blocks_of_the_kafka_page_run_as_written",
    ("docs/howto/kafka.md", "TLS (SASL_SSL)", 1):
        "tests/kafka/test_kafka_tls.py::test_the_tls_blocks_of_the_kafka_page_run_as_written",
    ("docs/howto/kafka.md", "Stream processors: Quix Streams", 0):
        "tests/kafka/test_kafka_quix.py::test_quix_counts_per_key_survive_a_restart_from_the_changelog",
    ("docs/howto/kafka.md", "Stream processors: Faust", 0):
        "tests/kafka/test_kafka_faust.py::test_faust_counts_per_key_in_a_table_with_a_compacted_changelog",
    ("README.md", "Mirroring between clusters", 0):
        "tests/mirror/test_cli_mirror.py::test_the_readme_mirroring_example_runs_as_written",
    ("README.md", "Kafka clients", 0):
        "tests/test_readme_examples.py::test_the_kafka_clients_example_runs_as_written",
    ("docs/howto/mirroring.md", "Mirroring between clusters", 0):
        NOT_RUN + "addresses of two real clusters; tests/mirror/test_cli_mirror.py runs the same commands",
    ("docs/howto/mirroring.md", "The audit across tiers", 0):
        NOT_RUN + "addresses of two real clusters and an example's output; tests/mirror/test_mirror_audit.py "
                  "runs the same command",
    ("docs/howto/replication.md", "Replication", 0):
        "tests/replication/test_replication_hosts.py::test_replicas_on_three_hosts_acks_all_and_not_enough_replicas",
    ("docs/howto/hosts.md", "Checking the guarantees under faults", 0):
        NOT_RUN + "a fault run of 60 s and one of 10 minutes, each with a cluster of its own; "
        "tests/testing/test_run.py runs the same runner briefly",
    ("docs/howto/hosts.md", "Checking the guarantees under faults", 1): HERE + "test_the_fault_kit_import_line_runs",
    ("docs/howto/hosts.md", "The compaction workload", 0):
        NOT_RUN + "a compaction fault run of 90 s and one of 10 minutes on five hosts; "
        "tests/testing/test_run_compaction.py runs the same runner briefly",
    ("docs/howto/hosts.md", "The transactional workload", 0):
        NOT_RUN + "a transactional fault run of 60 s and one of 10 minutes on five hosts; "
        "tests/testing/test_run_txn.py runs the same runner briefly",
    ("docs/howto/hosts.md", "Across hosts", 0):
        "tests/test_docs_site_hosts.py::test_the_hosts_kit_example_runs_as_written",
    ("docs/howto/hosts.md", "Across hosts", 1):
        NOT_RUN + "a ten-minute fault run on five hosts; tests/testing/test_run_hosts.py runs it briefly",
    ("docs/howto/operations.md", "One command on a laptop", 0): HERE + "test_one_command_on_a_laptop_runs_as_written",
    ("docs/howto/operations.md", "A cluster on your laptop that outlives commands", 0):
        NOT_RUN + "an example session (its export line shows ports of one run) on Ray's fake autoscaling "
        "cluster; tests/deploy/ starts and stops that cluster",
    ("docs/howto/operations.md", "The command line (after Kafka's tools)", 0):
        HERE + "test_the_command_line_session_runs_as_written",
    ("docs/howto/operations.md", "The command line (after Kafka's tools)", 1):
        NOT_RUN + "reassign needs four disk nodes, audit producers and consumers with auditing on, bench "
        "minutes of an autoscaling cluster, and zookeeper start the fixed port 2181; tests/tools/test_cli.py, "
        "test_cli_audit.py and test_autoscale.py run each of them",
    ("docs/howto/operations.md", "A cluster on AWS", 0): NOT_RUN + "ray up starts machines on AWS",
    ("docs/howto/operating.md", "Draining a node", 0):
        NOT_RUN + "needs a cluster of three disk nodes; tests/replication/test_handoff_hosts.py drains through the API",
    ("docs/howto/operating.md", "Rolling restart", 0):
        NOT_RUN + "restarts every disk node of a cluster; tests/actors/test_rolling_hosts.py does it through the API",
    ("docs/howto/operating.md", "Balancing leaders", 0):
        NOT_RUN + "needs a cluster of three disk nodes; tests/replication/test_handoff_hosts.py balances through the API",
    ("docs/howto/operating.md", "Measured", 0):
        NOT_RUN + "the benchmark runs for minutes (as root with --hosts); its figures are in docs/benchmarks.md",
    # -- Benchmarks ----------------------------------------------------------
    ("docs/benchmarks.md", "Benchmarks", 0):
        NOT_RUN + "the benchmarks run for minutes each and are run by hand; bench/ has their own checks",
    ("docs/benchmarks.md", "The paper's comparison (Figures 4 and 5)", 0):
        NOT_RUN + "installs RabbitMQ and ActiveMQ with sudo and runs for minutes",
    # -- the design contract -------------------------------------------------
    ("docs/design.md", "5. Public API (the contract users and tests rely on)", 0):
        "tests/test_design_api.py::test_design_section_5_runs_statement_by_statement",
}


# -- the site ----------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    """The site built with ``mkdocs build --strict`` into a temporary directory."""
    out = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(out)],
        capture_output=True, text=True, cwd=str(REPO), timeout=600,
    )
    took = time.monotonic() - started
    print(f"mkdocs build --strict: {took:.1f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    return out


def test_the_site_builds_with_warnings_as_errors_and_has_every_page(site):
    config = (REPO / "mkdocs.yml").read_text()
    assert "strict: true" in config
    for page in pages():
        if page.name == "README.md":
            continue
        relative = page.relative_to(REPO / "docs").with_suffix("")
        built = site / ("index.html" if str(relative) == "index" else relative / "index.html")
        assert built.exists(), f"{page} was not built (missing from the nav?)"
        assert str(page.relative_to(REPO / "docs")) in config, f"{page} is not in mkdocs.yml's nav"


def test_the_cli_reference_is_generated_from_every_command(site):
    import click

    from raylog.testing.runner import add_arguments
    from raylog.tools.cli import cli

    html = (site / "reference" / "cli" / "index.html").read_text()

    def walk(group, ctx):
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            sub = click.Context(command, info_name=name, parent=ctx)
            yield command, sub
            if isinstance(command, click.Group):
                yield from walk(command, sub)

    commands = list(walk(cli, click.Context(cli, info_name="raylog")))
    assert len(commands) > 15
    for command, ctx in commands:
        assert f"<code>{ctx.command_path}</code>" in html, f"{ctx.command_path} is missing"
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("--"):
                    assert opt in html, f"{ctx.command_path} {opt} is missing"
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for action in parser._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and opt != "--help":
                assert opt in html, f"raylog faults {opt} is missing"
    assert "cli-reference" not in html  # the marker was replaced


def test_the_api_reference_documents_the_public_api_from_its_docstrings(site):
    html = (site / "reference" / "api" / "index.html").read_text()
    # docs/design.md section 5's calls, each with its docstring's words
    for name in ("connect", "Client", "create_topic", "list_topics", "describe_topic", "delete_topic",
                 "producer", "producer_actor", "consumer", "Producer", "send", "flush", "Consumer", "poll",
                 "commit", "seek", "Message", "RetryPolicy", "read_topic", "init_spark", "read_raylog",
                 "plan_read", "RaylogError", "DeliveryError", "CorruptMessageError"):
        assert f'id="{name}"' in html or f'.{name}"' in html, f"{name} is not in the API reference"
    from raylog.client import Client

    first_line = Client.create_topic.__doc__.strip().splitlines()[0]
    assert " ".join(first_line.split()[:4]) in " ".join(html.split()), "docstrings are not rendered"


# -- the blocks ----------------------------------------------------------------


def test_every_code_block_is_run_by_a_test_or_listed_as_not_run():
    import markdown

    found = {b.key: b for b in all_blocks()}
    unlisted = sorted(set(found) - set(BLOCKS))
    assert not unlisted, "code blocks nobody runs (add them to BLOCKS):\n" + "\n".join(
        f"{found[k].page}:{found[k].line} under {k[1]!r} (#{k[2]})" for k in unlisted)
    gone = sorted(set(BLOCKS) - set(found))
    assert not gone, f"BLOCKS lists blocks the pages no longer have: {gone}"
    for key, runner in BLOCKS.items():
        where = f"{key[0]}:{found[key].line}"
        if runner.startswith(NOT_RUN):
            assert found[key].language == "text", f"{where}: a block not run must be tagged ```text"
            continue
        assert found[key].language != "text", f"{where}: a ```text block is not run; {runner} says it is"
        if runner.startswith(HERE):
            assert callable(globals().get(runner[len(HERE):])), f"{where}: no test {runner}"
            continue
        path, test = runner.split("::")
        source = (REPO / path).read_text()
        assert f"def {test}(" in source, f"{where}: {runner} does not exist"
        page = key[0]
        assert page in source or (page == "README.md" and "readme_block(" in source) or (
            page == "docs/index.md" and "docs/index.md" in source), f"{where}: {path} does not read {page}"
    # no code block that is not fenced (an indented one would escape the list)
    for page in pages():
        text = page.read_text()
        html = markdown.markdown(text, extensions=["pymdownx.superfences", "tables", "admonition"])
        assert html.count("<pre") == len(blocks_of(page)), f"{page}: a code block that is not fenced"


def test_a_broken_block_is_seen(tmp_path, monkeypatch):
    """The control: a block changed on a page runs changed (it is read from the
    page each run), and a block added to a page is caught as unlisted."""
    import tests.doc_blocks as doc_blocks

    copy = tmp_path / "docs" / "howto"
    copy.mkdir(parents=True)
    page = (REPO / "docs" / "howto" / "hosts.md").read_text()
    (copy / "hosts.md").write_text(page.replace("pause_actor, flip_byte", "pause_actor, flip_bytes"))
    monkeypatch.setattr(doc_blocks, "REPO", tmp_path)
    code = doc_blocks.block("docs/howto/hosts.md", "Checking the guarantees under faults", index=1)
    with pytest.raises(ImportError, match="flip_bytes"):
        exec(compile(code, "hosts.md", "exec"), {})


# -- the blocks run here ---------------------------------------------------------


def _path_env(**extra) -> dict:
    """The venv's scripts first on the PATH (the pages call ``raylog``)."""
    bin_dir = os.path.dirname(sys.executable)
    return {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), **extra}


def test_the_quickstart_commands_are_make_targets():
    """``make demo`` and ``make test`` as written, dry (MAKEFLAGS=n): both are
    targets of the Makefile. The demo's program itself runs in
    tests/test_readme_examples.py (smaller), and ``make test`` is this suite."""
    code = block("docs/index.md", "Quickstart", "bash")
    assert block("README.md", "Quickstart", "bash") == code
    proc = subprocess.run(["bash", "-eo", "pipefail", "-c", code], cwd=str(REPO), capture_output=True, text=True,
                          env={**os.environ, "MAKEFLAGS": "n"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "-m raylog.tools.demo" in proc.stdout and "-m pytest" in proc.stdout, proc.stdout


def test_the_fault_kit_import_line_runs():
    exec(compile(block("docs/howto/hosts.md", "Checking the guarantees under faults", index=1), "hosts.md", "exec"),
         {})


def test_one_command_on_a_laptop_runs_as_written(tmp_path):
    """``raylog topics create demo`` on the embedded default: a Ray and a
    ZooKeeper of the command's own, gone when it ends."""
    code = block("docs/howto/operations.md", "One command on a laptop", "bash")
    proc = run_example(code, tmp_path, env=_path_env(), command=["bash", "-eo", "pipefail"])
    assert proc.returncode == 0, proc.stderr
    assert "demo" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr


def test_the_command_line_session_runs_as_written(zookeeper, ray_local, tmp_path):
    """The Operations page's session, command by command (bash -e: each must
    succeed), on the test ZooKeeper and Ray under a cluster name of its own."""
    from raylog.actors.supervisor import stop_supervisor
    from raylog.zk.session import connect_kazoo

    if not zookeeper.running:
        zookeeper.start()
    cluster = f"docs-{uuid.uuid4().hex[:12]}"
    env = _path_env(RAYLOG_ZOOKEEPER=zookeeper.connect_string,
                    RAYLOG_RAY_ADDRESS=ray_local.get_runtime_context().gcs_address,
                    RAYLOG_CLUSTER=cluster, RAYLOG_DATA_DIR=str(tmp_path / "data"))
    code = block("docs/howto/operations.md", "The command line (after Kafka's tools)", "bash")
    try:
        proc = run_example(code + 'test -n "$RAYLOG_TOKEN"\n', tmp_path, env=env,
                           command=["bash", "-eo", "pipefail"])
    finally:
        stop_supervisor(cluster)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout
    assert "/home" in out and "user-1" in out, out  # consumed with its key
    assert "\n{" in out, out  # describe --json: one JSON document
    described, _ = json.JSONDecoder().raw_decode(out[out.index("\n{") + 1:])
    assert described["topic"] == "clicks" and len(described["partitions"]) == 6, described  # grown from 4
    zk = connect_kazoo(zookeeper.connect_string)
    try:
        assert not zk.exists(f"/raylog/{cluster}/topics/clicks")  # the last line deleted it
    finally:
        zk.stop()
        zk.close()


def test_the_corrupt_message_snippet_skips_a_damaged_message(raylog_client, make_topic):
    """The snippet on a partition with a damaged message: the poll raises
    ``CorruptMessageError`` and ``skip_corrupt()`` moves past it."""
    import raylog
    from raylog.testing.faults import flip_byte

    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks="all")
    offsets = [producer.send(topic, value).result(60)[1] for value in (b"first", b"damaged", b"after")]
    producer.close()
    flip_byte(raylog_client.registry.placement(topic, 0)["log_dir"], offsets[1])
    consumer = raylog_client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    code = block("docs/howto/groups.md", "Consumer groups: the commit rule")
    try:
        skipped = {}
        deadline = time.monotonic() + 60
        while not skipped and time.monotonic() < deadline:
            namespace = {"consumer": consumer, "raylog": raylog}
            exec(compile(code, "groups.md", "exec"), namespace)
            skipped = namespace.get("skipped", {})
        assert list(skipped) == [(topic, 0)], skipped
        assert skipped[(topic, 0)][0] == offsets[1]
    finally:
        consumer.close()
