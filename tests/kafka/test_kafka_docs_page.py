"""The Kafka front door page (docs/howto/kafka.md): its client blocks run as
written against a real cluster and its listeners, and the API table the site
shows is the one the listener serves."""

from __future__ import annotations

import contextlib
import io
import re
import sys

import pytest

from tests.doc_blocks import REPO, block

pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.timeout(600)

PAGE = "docs/howto/kafka.md"


@pytest.fixture(scope="module")
def clicks(raylog_client, listeners):
    if "clicks" not in raylog_client.list_topics():
        raylog_client.create_topic("clicks")
    return raylog_client


def _run(heading: str, client) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block(PAGE, heading), f"{PAGE}:{heading}", "exec"), {"client": client, "__name__": "__main__"})
    return out.getvalue().splitlines()


def test_the_confluent_kafka_block_runs_as_written(clicks):
    assert _run("confluent-kafka", clicks) == ["b'user-42' b'hello'"]


def test_the_kafka_python_block_runs_as_written(clicks):
    assert _run("kafka-python", clicks) == ["b'user-42' b'hello'"]


def test_the_aiokafka_block_runs_as_written(clicks):
    assert _run("aiokafka", clicks) == ["b'user-42' b'hello'"]


def test_the_topics_created_on_first_use_block_runs_as_written(clicks):
    assert _run("Topics created on first use", clicks) == ["1"]
    assert "made-on-first-send" in clicks.list_topics()


def test_the_page_lists_every_api_the_listener_serves():
    """The table the hook writes holds every key of SUPPORTED with its versions."""
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        import kafka_reference
    finally:
        sys.path.remove(str(REPO / "docs" / "hooks"))
    from raylog.kafka.frames import SUPPORTED

    page = (REPO / PAGE).read_text()
    table = kafka_reference.on_page_markdown(page, type("P", (), {"file": type("F", (), {"src_uri": "howto/kafka.md"})})(),
                                             None, None)
    assert kafka_reference.APIS not in table and kafka_reference.LIMITS not in table
    for key, (request, low, high) in SUPPORTED.items():
        name = request.__name__.removesuffix("Request")
        assert f"| {name} | {key} | {low}–{high} |" in table or f"| {name} | {key} | {low} |" in table, name


def test_the_page_lists_every_topic_config_createtopics_takes():
    from raylog.config import TopicConfig
    from raylog.kafka.admin import TOPIC_CONFIGS

    text = (REPO / PAGE).read_text()
    section = text.split("### Topic configs", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z.]+)` \| `([a-z_]+)`", section, re.M))
    assert rows == TOPIC_CONFIGS
    assert all(hasattr(TopicConfig(), field) for field in rows.values())


def test_the_page_says_which_topic_configs_change_on_a_live_topic():
    from raylog.kafka.admin import TOPIC_CONFIGS
    from raylog.zk.live_config import FIXED_SETTINGS

    text = (REPO / PAGE).read_text()
    section = text.split("### Topic configs", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z.]+)` \| `[a-z_]+`.*\| (live|fixed at creation) \|$", section, re.M))
    assert set(rows) == set(TOPIC_CONFIGS)
    assert {name: (TOPIC_CONFIGS[name] in FIXED_SETTINGS) for name in rows} == {
        name: kind == "fixed at creation" for name, kind in rows.items()}
