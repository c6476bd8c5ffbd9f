"""The schema registry against a real (embedded) ZooKeeper."""

from __future__ import annotations

import json
import threading

import pytest

from raylog.errors import ClosedError, SchemaError, UnknownSchemaError
from raylog.zk.paths import Paths
from raylog.zk.schemas import SchemaRegistry, canonical_schema

CLICK_V1 = {
    "type": "record",
    "name": "Click",
    "namespace": "web",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

CLICK_V2 = {
    "type": "record",
    "name": "Click",
    "namespace": "web",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "page", "type": ["null", "string"], "default": None},
    ],
}


@pytest.fixture
def schemas(zk, cluster_name):
    return SchemaRegistry(zk, cluster_name)


# failures first


def test_get_unknown_id_fails(schemas):
    with pytest.raises(UnknownSchemaError) as info:
        schemas.get(12345)
    assert "12345" in str(info.value) and "register" in str(info.value)
    assert info.value.schema_id == 12345


def test_get_negative_or_non_int_id_fails(schemas):
    for bad in (-1, "1", 1.0, True):
        with pytest.raises(UnknownSchemaError):
            schemas.get(bad)


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "nope"},
        {"type": "record", "name": "R", "fields": [{"name": "a", "type": "strin"}]},
        {"type": "enum", "name": "E", "symbols": ["A", "A"]},
        {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": "x"}]},
        "{not json",
        42,
    ],
    ids=["unknown-type", "unknown-field-type", "duplicate-symbols", "bad-default", "bad-json", "not-a-schema"],
)
def test_register_invalid_schema_fails_and_stores_nothing(schemas, zk, cluster_name, bad):
    with pytest.raises(SchemaError) as info:
        schemas.register(bad)
    assert not isinstance(info.value, UnknownSchemaError)
    assert schemas.list() == {}
    assert not zk.exists(Paths(cluster_name).schemas) or zk.get_children(Paths(cluster_name).schemas) == []


def test_stopped_client_is_closed(make_zk, cluster_name):
    # A stopped client never comes back by itself: not a retriable outage.
    client = make_zk()
    schemas = SchemaRegistry(client, cluster_name, request_timeout_s=2)
    client.stop()
    with pytest.raises(ClosedError):
        schemas.register(CLICK_V1)
    with pytest.raises(ClosedError):
        schemas.get(0)


# the normal path


def test_register_then_get_round_trips(schemas, zk, cluster_name):
    schema_id = schemas.register(CLICK_V1)
    assert isinstance(schema_id, int) and schema_id >= 0
    got = schemas.get(schema_id)
    assert got == canonical_schema(CLICK_V1)[0]
    assert got["name"] == "web.Click"
    assert [f["name"] for f in got["fields"]] == ["user", "ts"]
    # stored where docs/design.md §4 says, as JSON
    data, _ = zk.get(Paths(cluster_name).schema(schema_id))
    assert json.loads(data) == got


def test_get_from_a_fresh_registry_reads_zookeeper(schemas, make_zk, cluster_name):
    schema_id = schemas.register(CLICK_V1)
    other = SchemaRegistry(make_zk(), cluster_name)
    assert other.get(schema_id) == schemas.get(schema_id)


def test_register_is_idempotent(schemas, make_zk, cluster_name):
    first = schemas.register(CLICK_V1)
    assert schemas.register(CLICK_V1) == first
    # another spelling of the same schema: JSON text, other key order, full name
    respelled = json.dumps(
        {
            "fields": CLICK_V1["fields"],
            "name": "web.Click",
            "type": "record",
        }
    )
    assert schemas.register(respelled) == first
    # a registry with an empty cache finds it through ZooKeeper
    assert SchemaRegistry(make_zk(), cluster_name).register(CLICK_V1) == first
    assert list(schemas.list()) == [first]


def test_two_versions_get_different_ids(schemas):
    v1 = schemas.register(CLICK_V1)
    v2 = schemas.register(CLICK_V2)
    assert v1 != v2 and v2 > v1
    assert schemas.get(v1) != schemas.get(v2)
    assert schemas.list() == {v1: schemas.get(v1), v2: schemas.get(v2)}


def test_clusters_do_not_share_schemas(zk, cluster_name):
    ours = SchemaRegistry(zk, cluster_name)
    theirs = SchemaRegistry(zk, cluster_name + "-other")
    schema_id = ours.register(CLICK_V1)
    assert theirs.list() == {}
    with pytest.raises(UnknownSchemaError):
        theirs.get(schema_id)


def test_get_returns_a_copy(schemas):
    schema_id = schemas.register(CLICK_V1)
    schemas.get(schema_id)["fields"].clear()
    assert len(schemas.get(schema_id)["fields"]) == 2


def test_primitive_and_union_schemas_register(schemas):
    ids = {schemas.register("string"), schemas.register('"long"'), schemas.register(["null", "int"])}
    assert len(ids) == 3
    assert schemas.register('"string"') in ids


def test_concurrent_registrars_agree_on_one_id(make_zk, cluster_name):
    registries = [SchemaRegistry(make_zk(), cluster_name) for _ in range(4)]
    results: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(registries))

    def register(registry):
        try:
            start.wait(timeout=10)
            results.append(registry.register(CLICK_V2))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=register, args=(r,)) for r in registries]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert len(results) == len(registries) and len(set(results)) == 1
    # the losers removed their sequential nodes: one schema is listed
    assert list(registries[0].list()) == results[:1]


# ----------------------------------------------------------------------------
# subjects


def test_subject_versions_name_ids_in_order_and_latest(schemas, make_zk, cluster_name):
    v1 = {"type": "record", "name": "S", "fields": [{"name": "a", "type": "long"}]}
    v2 = {"type": "record", "name": "S", "fields": [{"name": "a", "type": "long"},
                                                     {"name": "b", "type": "string", "default": ""}]}
    first = schemas.register(v1, subject="s-value")
    assert schemas.register(v1, subject="s-value") == first  # its latest already: no new version
    second = schemas.register(v2, subject="s-value")
    other = schemas.register(v1, subject="other")
    assert other == first
    assert schemas.versions("s-value") == {1: first, 2: second}
    assert schemas.subject_version("s-value") == second
    assert schemas.subject_version("s-value", 1) == first
    assert schemas.subjects() == ["other", "s-value"]
    # another process sees the same
    fresh = SchemaRegistry(make_zk(), cluster_name)
    assert fresh.subject_version("s-value", "latest") == second
    assert fresh.register(v1, subject="s-value") == first  # v1 again after v2: version 3
    assert fresh.versions("s-value") == {1: first, 2: second, 3: first}


def test_unknown_subjects_versions_and_bad_names_are_typed_errors(schemas):
    with pytest.raises(UnknownSchemaError, match="no schema is registered under subject 'nope'"):
        schemas.subject_version("nope")
    schemas.register("long", subject="n")
    with pytest.raises(UnknownSchemaError, match="has no version 2"):
        schemas.subject_version("n", 2)
    for version in (0, -1, "2", True, None):
        with pytest.raises(SchemaError, match="'latest' or a number from 1"):
            schemas.subject_version("n", version)
    for bad in ("", "a/b", "..", 7):
        with pytest.raises(SchemaError, match="a schema subject is a non-empty name"):
            schemas.register("long", subject=bad)
    assert schemas.subjects() == ["n"]
