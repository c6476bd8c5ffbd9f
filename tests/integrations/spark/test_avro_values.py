"""Typed Avro reads (``read_topic(value_format="avro")`` and
``spark.read.format("raylog").option("value_format", "avro")``) on a real
Spark through RayDP: the JVM reader (values decoded in the executors' JVMs,
``org.raylog.spark.AvroReader``) and the Python reader (fastavro in the
Python workers) give the same columns and the same values for every type
the mapping supports, resolve other writer schemas alike, and fail alike on
values that are not Avro frames.

Expected values are written here from the records produced, not read back
through either decoder.
"""

from __future__ import annotations

import datetime
import decimal
import uuid

import pytest

import raylog_spark
from raylog.avro import AvroSerializer, frame
from raylog.errors import ConfigError, UnknownSchemaError
from raylog.zk.schemas import SchemaRegistry
from spark_helpers import produce

pytestmark = pytest.mark.timeout(600)

ENGINES = ("jvm", "python")


def registry(client) -> SchemaRegistry:
    return SchemaRegistry(client.metadata.zk, client.settings.cluster)


def read(spark, client, topic, engine, **kw):
    df = raylog_spark.read_topic(spark, topic, value_format="avro", client=client, engine=engine, **kw)
    assert df.raylog_engine == engine
    return df


def plain(value):
    """A collected value as plain Python (Rows as dicts, recursively)."""
    if hasattr(value, "asDict"):
        return {k: plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return value


def rows(df, key="offset"):
    return [plain(r) for r in sorted(df.collect(), key=lambda r: (r["partition"], r[key]))]


# ---------------------------------------------------------------------------
# every type, both engines

EVERY_TYPE = {
    "type": "record",
    "name": "Every",
    "namespace": "test",
    "fields": [
        {"name": "flag", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "n", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {
            "name": "inner",
            "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": ["null", "string"]}]},
        },
        {"name": "maybe_n", "type": ["null", "long"], "default": None},
        {"name": "wide", "type": ["int", "long"]},
        {"name": "real", "type": ["null", "float", "double"]},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "localu", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {
            "name": "big",
            "type": {"type": "fixed", "name": "Big", "size": 12, "logicalType": "decimal", "precision": 25, "scale": 4},
        },
        {"name": "maybe_id", "type": ["null", {"type": "string", "logicalType": "uuid"}], "default": None},
        {"name": "times", "type": {"type": "array", "items": {"type": "int", "logicalType": "time-millis"}}},
    ],
}
AT = datetime.datetime(2026, 11, 22, 14, 30, 5, 123000, tzinfo=datetime.timezone.utc)


def every_record(i: int) -> dict:
    ids = uuid.UUID(int=i * 7919 + 1)
    return {
        "flag": i % 2 == 0,
        "i": -i * 1000,
        "n": i * 10**12,
        "f": i / 4,
        "d": i / 3,
        "s": f"héllo-{i}",
        "b": bytes([i, 0, 255]),
        "fx": bytes([i, i, i, i]),
        "color": ["RED", "GREEN", "BLUE"][i % 3],
        "tags": [f"t{k}" for k in range(i % 4)],
        "counts": {f"k{k}": k * i for k in range(i % 3)},
        "inner": {"x": i, "y": None if i % 2 else f"y{i}"},
        "maybe_n": None if i % 3 == 0 else i,
        "wide": i if i % 2 else 2**40 + i,
        "real": None if i % 4 == 0 else (i / 8 if i % 4 == 1 else float(i)),
        "id": ids,
        "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=i),
        "tm": datetime.time(1, 2, 3, 4000 * i),
        "tu": datetime.time(1, 2, 3, 7 * i),
        "ts": AT + datetime.timedelta(milliseconds=i),
        "tsu": AT + datetime.timedelta(microseconds=i),
        "local": (AT + datetime.timedelta(milliseconds=i)).replace(tzinfo=None),
        "localu": (AT + datetime.timedelta(microseconds=i)).replace(tzinfo=None),
        "amount": decimal.Decimal(f"{i - 10}.25"),
        "big": decimal.Decimal(f"12345678901234567890.{i:04d}"),
        "maybe_id": ids if i % 2 else None,
        "times": [datetime.time(0, 0, 1)] * (i % 3),
    }


@pytest.fixture(scope="module")
def every(raylog_client):
    serialize = AvroSerializer(registry(raylog_client), EVERY_TYPE)
    topic = "avro-every-type"
    raylog_client.create_topic(topic, partitions=2)
    produce(raylog_client, topic, [(b"k%d" % i, serialize(every_record(i))) for i in range(24)])
    return topic, serialize.schema_id


def test_every_type_decodes_alike_in_the_jvm_and_in_python(spark, raylog_client, every):
    topic, _ = every
    jvm, python = (read(spark, raylog_client, topic, e) for e in ENGINES)
    assert jvm.schema == python.schema
    names = [f["name"] for f in EVERY_TYPE["fields"]]
    assert jvm.columns == [*names, "key", "topic", "partition", "offset", "timestamp"]
    got = rows(jvm)
    assert got == rows(python)
    assert len(got) == 24
    for r in got:
        i = int(bytes(r["key"])[1:])
        want = every_record(i)
        for name in ("flag", "i", "n", "f", "d", "s", "b", "fx", "color", "tags", "counts", "inner", "maybe_n", "wide"):
            assert r[name] == want[name], name
        assert r["real"] == want["real"]
        assert r["id"] == str(want["id"]) and r["maybe_id"] == (str(want["id"]) if i % 2 else None)
        assert r["day"] == want["day"]
        assert r["tm"] == 3_723_000 + 4 * i  # ms since midnight
        assert r["tu"] == 3_723_000_000 + 7 * i  # µs since midnight
        assert r["ts"].timestamp() == pytest.approx(want["ts"].timestamp(), abs=1e-6)
        assert r["tsu"].timestamp() == pytest.approx(want["tsu"].timestamp(), abs=1e-7)
        assert r["local"] == want["local"] and r["localu"] == want["localu"]
        assert r["amount"] == want["amount"] and r["big"] == want["big"]
        assert r["times"] == [1000] * (i % 3)


def test_pruned_columns_and_the_value_as_one_struct_agree(spark, raylog_client, every):
    topic, _ = every
    for flatten in (True, False):
        dfs = [read(spark, raylog_client, topic, e, flatten=flatten) for e in ENGINES]
        if flatten:
            picked = [df.select("partition", "offset", "day", "amount", "tags") for df in dfs]
        else:
            picked = [df.select("partition", "offset", "value.inner", "value.ts", "value") for df in dfs]
        assert rows(picked[0]) == rows(picked[1])
    sums = [read(spark, raylog_client, topic, e).agg({"d": "sum", "n": "max"}).collect()[0] for e in ENGINES]
    assert sums[0] == sums[1]
    assert sums[0]["max(n)"] == 23 * 10**12


def test_a_typed_read_by_name(spark, raylog_client, every):
    topic, schema_id = every
    assert raylog_spark.use_cluster(spark, raylog_client)
    by_name = (
        spark.read.format("raylog")
        .option("subscribe", topic)
        .option("value_format", "avro")
        .option("avro_schema_id", str(schema_id))
        .load()
    )
    assert by_name.columns[-6:] == ["key", "topic", "partition", "offset", "timestamp", "timestampType"]
    python = read(spark, raylog_client, topic, "python")
    assert rows(by_name.select(*python.columns)) == rows(python)
    with pytest.raises(Exception, match="ConfigError: .*avro_schema_id"):
        spark.read.format("raylog").option("subscribe", topic).option("value_format", "avro").load()
    with pytest.raises(Exception, match="UnknownSchemaError"):
        spark.read.format("raylog").option("subscribe", topic).option("value_format", "avro").option(
            "avro_schema_id", "987654"
        ).load()


def test_a_typed_stream(spark, raylog_client, every):
    topic, schema_id = every
    assert raylog_spark.use_cluster(spark, raylog_client)
    columns = ["partition", "offset", "i", "day", "inner", "counts"]
    query = (
        spark.readStream.format("raylog")
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("value_format", "avro")
        .option("avro_schema_id", str(schema_id))
        .load()
        .select(*columns)
        .writeStream.format("memory")
        .queryName("typed_stream")
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300)
    assert query.exception() is None
    assert rows(spark.table("typed_stream")) == rows(read(spark, raylog_client, topic, "python").select(*columns))


# ---------------------------------------------------------------------------
# schema evolution

AVRO_V1 = {
    "type": "record",
    "name": "Visit",
    "namespace": "test",
    "fields": [{"name": "id", "type": "long"}, {"name": "page", "type": "string"}],
}
AVRO_V2 = {
    "type": "record",
    "name": "Visit",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "page", "type": "string"},
        {"name": "seconds", "type": "double", "default": -1.0},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}


@pytest.mark.parametrize("engine", ENGINES)
def test_avro_values_with_two_schema_versions(spark, raylog_client, make_topic, engine):
    v1, v2 = AvroSerializer(registry(raylog_client), AVRO_V1), AvroSerializer(registry(raylog_client), AVRO_V2)
    topic = make_topic(partitions=2)
    values = [v1({"id": i, "page": f"/v1/{i}"}) for i in range(30)]
    values += [v2({"id": 100 + i, "page": f"/v2/{i}", "seconds": i / 2, "tags": ["a"] * (i % 3)}) for i in range(30)]
    produce(raylog_client, topic, [(b"k%d" % (i % 2), v) for i, v in enumerate(values)])

    # default: the schema of the first message (v1); v2 records resolved to it
    first = read(spark, raylog_client, topic, engine)
    assert first.columns == ["id", "page", "key", "topic", "partition", "offset", "timestamp"]
    assert first.schema["id"].dataType.typeName() == "long"
    assert sorted(r["id"] for r in first.select("id").collect()) == list(range(30)) + list(range(100, 130))

    # v2 as the reader schema: v1 records get the defaults
    second = read(spark, raylog_client, topic, engine, schema_id=v2.schema_id)
    got = {r["id"]: r for r in second.collect()}
    assert len(got) == 60
    assert got[3]["seconds"] == -1.0 and got[3]["tags"] == [] and got[3]["page"] == "/v1/3"
    assert got[104]["seconds"] == 2.0 and got[104]["tags"] == ["a"]
    assert second.agg({"seconds": "sum"}).collect()[0][0] == pytest.approx(-30 + sum(i / 2 for i in range(30)))

    nested = read(spark, raylog_client, topic, engine, schema_id=v2.schema_id, flatten=False)
    assert nested.where("value.id >= 100").count() == 30


def test_the_reader_schema_by_subject_and_version(spark, raylog_client, make_topic):
    """The reader schema named as a version of a subject (latest by default),
    in read_topic (both engines) and in a read by name."""
    subject = f"visits-{make_topic(partitions=1)}"
    v1 = AvroSerializer(registry(raylog_client), AVRO_V1, subject=subject)
    v2 = AvroSerializer(registry(raylog_client), AVRO_V2, subject=subject)
    assert registry(raylog_client).versions(subject) == {1: v1.schema_id, 2: v2.schema_id}
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [(None, v1({"id": 1, "page": "/a"})),
                                   (None, v2({"id": 2, "page": "/b", "seconds": 1.5, "tags": []}))])
    assert raylog_spark.use_cluster(spark, raylog_client)
    for engine in ENGINES:
        latest = read(spark, raylog_client, topic, engine, schema_subject=subject)
        assert "seconds" in latest.columns
        assert sorted((r["id"], r["seconds"]) for r in latest.collect()) == [(1, -1.0), (2, 1.5)]
        first = read(spark, raylog_client, topic, engine, schema_subject=subject, schema_version=1)
        assert first.columns[:2] == ["id", "page"] and "seconds" not in first.columns
    by_name = (spark.read.format("raylog").option("subscribe", topic).option("value_format", "avro")
               .option("avro_subject", subject))
    assert sorted((r["id"], r["seconds"]) for r in by_name.load().collect()) == [(1, -1.0), (2, 1.5)]
    assert "seconds" not in by_name.option("avro_subject_version", "1").load().columns
    with pytest.raises(Exception, match="UnknownSchemaError: subject .* has no version 3"):
        by_name.option("avro_subject_version", "3").load()
    with pytest.raises(Exception, match="UnknownSchemaError: no schema is registered under subject"):
        spark.read.format("raylog").option("subscribe", topic).option("value_format", "avro").option(
            "avro_subject", "no-such-subject").load()
    with pytest.raises(Exception, match="ConfigError: .*not both"):
        by_name.option("avro_schema_id", str(v1.schema_id)).load()
    with pytest.raises(ConfigError, match="not both"):
        read(spark, raylog_client, topic, "python", schema_subject=subject, schema_id=v1.schema_id)
    with pytest.raises(UnknownSchemaError, match="has no version 3"):
        read(spark, raylog_client, topic, "python", schema_subject=subject, schema_version=3)


# ---------------------------------------------------------------------------
# failures


def test_unknown_avro_schema_ids_are_typed_errors(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [(None, frame(987_654, b"\x02"))])
    with pytest.raises(UnknownSchemaError):
        raylog_spark.read_topic(spark, topic, value_format="avro", client=raylog_client)
    with pytest.raises(UnknownSchemaError):
        raylog_spark.read_topic(spark, topic, value_format="avro", schema_id=987_655, client=raylog_client)
    empty = make_topic(partitions=1)
    with pytest.raises(ConfigError, match="schema_id="):
        raylog_spark.read_topic(spark, empty, value_format="avro", client=raylog_client)


@pytest.mark.parametrize("engine", ENGINES)
def test_values_that_are_not_avro_frames_fail_the_read_with_a_schema_error(spark, raylog_client, make_topic, engine):
    v1 = AvroSerializer(registry(raylog_client), AVRO_V1)
    good = v1({"id": 1, "page": "/"})
    cases = {
        "short": b"\x00\x00",
        "magic": b"\x07" + good[1:],
        "truncated": good[:-1],
        "trailing": good + b"\x00",
        "unregistered": frame(987_653, b"\x02"),
    }
    for what, bad in cases.items():
        topic = make_topic(partitions=1)
        produce(raylog_client, topic, [(None, good), (None, bad)])
        df = read(spark, raylog_client, topic, engine, schema_id=v1.schema_id)
        with pytest.raises(Exception, match="UnknownSchemaError" if what == "unregistered" else "SchemaError"):
            df.select("id", "page").collect()


def test_mode_permissive_gives_null_values_for_bad_records_and_failfast_fails(spark, raylog_client, make_topic):
    """Spark's from_avro: mode FAILFAST (the default) fails on a value that
    does not decode; PERMISSIVE gives its row with null value columns."""
    assert raylog_spark.use_cluster(spark, raylog_client)
    v1 = AvroSerializer(registry(raylog_client), AVRO_V1)
    bad = [b"\x00\x00", b"\x07" + v1({"id": 0, "page": "/"})[1:], frame(987_652, b"\x02")]
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [(None, v1({"id": 1, "page": "/a"}))] + [(None, b) for b in bad]
            + [(None, v1({"id": 2, "page": "/b"}))])

    def by_name(**options):
        reader = spark.read.format("raylog").option("subscribe", topic).option("value_format", "avro")
        return reader.option("avro_schema_id", str(v1.schema_id)).options(**options).load()

    with pytest.raises(Exception, match="SchemaError"):
        by_name().select("id", "page").collect()
    with pytest.raises(Exception, match="SchemaError"):
        by_name(mode="FAILFAST").select("id", "page").collect()
    df = by_name(mode="PERMISSIVE")
    assert all(f.nullable for f in df.schema.fields if f.name in ("id", "page"))
    got = [(r["id"], r["page"]) for r in sorted(df.select("offset", "id", "page").collect(), key=lambda r: r["offset"])]
    assert got == [(1, "/a"), (None, None), (None, None), (None, None), (2, "/b")]
    whole = by_name(mode="permissive", flatten="false").select("offset", "value").collect()
    assert [r["value"] is None for r in sorted(whole, key=lambda r: r["offset"])] == [False, True, True, True, False]
    with pytest.raises(Exception, match="ConfigError: .*'mode' must be FAILFAST or PERMISSIVE"):
        by_name(mode="DROPMALFORMED").collect()


def test_unsupported_unions_are_refused_on_the_driver(spark, raylog_client, make_topic):
    schema = {"type": "record", "name": "U", "fields": [{"name": "u", "type": ["string", "long"]}]}
    serialize = AvroSerializer(registry(raylog_client), schema)
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [(None, serialize({"u": "a"}))])
    for engine in ENGINES:
        with pytest.raises(ConfigError, match="unions"):
            read(spark, raylog_client, topic, engine)
