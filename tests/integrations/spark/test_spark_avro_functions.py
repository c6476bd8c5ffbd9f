"""``raylog_spark.functions``: ``from_avro`` / ``to_avro`` with Spark's
semantics and the Confluent-framed variants over raylog's registry, on a
real Spark through RayDP (values decoded and encoded in the executors'
JVMs, ``org.raylog.spark.FromAvro`` / ``ToAvro``), with real ZooKeeper and
raylog topics.

Expected values are written here from the rows or records given, and bytes
are checked against fastavro, not against the code under test alone.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json

import fastavro
import pytest

import raylog_spark
from raylog.avro import AvroDeserializer, AvroSerializer, frame
from raylog.errors import ConfigError, SchemaError, UnknownSchemaError
from raylog.zk.schemas import SchemaRegistry
from raylog_spark.functions import from_avro, from_confluent_avro, to_avro, to_confluent_avro
from spark_helpers import produce

pytestmark = pytest.mark.timeout(600)


def registry(client) -> SchemaRegistry:
    return SchemaRegistry(client.metadata.zk, client.settings.cluster)


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


def fastavro_body(schema, record) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def fastavro_read(schema, body: bytes):
    return fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(schema))


def nullable(t):
    return ["null", t]


# ---------------------------------------------------------------------------
# typed round trips

ROW_SCHEMA = {
    "type": "record",
    "name": "Row",
    "namespace": "test",
    "fields": [
        {"name": "i", "type": "int"},
        {"name": "n", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "flag", "type": "boolean"},
        {"name": "maybe", "type": nullable("long")},
        {"name": "inner", "type": {"type": "record", "name": "Inner",
                                   "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": nullable("string")}]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": nullable("double")}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": nullable({"type": "long", "logicalType": "timestamp-micros"})},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "big", "type": {"type": "fixed", "name": "Big", "size": 12, "logicalType": "decimal",
                                 "precision": 25, "scale": 4}},
    ],
}
ROW_DDL = (
    "i int not null, n bigint not null, f float not null, d double not null, s string not null, b binary not null, "
    "flag boolean not null, maybe bigint, inner struct<x: int not null, y: string> not null, "
    "tags array<string> not null, counts map<string, double> not null, color string not null, "
    "day date not null, ts_ms timestamp not null, ts_us timestamp, amount decimal(9,2) not null, "
    "big decimal(25,4) not null"
)
EPOCH = datetime.datetime(1970, 1, 1)


def micros(ts: datetime.datetime) -> int:
    return (ts - EPOCH) // datetime.timedelta(microseconds=1)


def rows(count: int = 6) -> list[dict]:
    out = []
    for i in range(count):
        at = datetime.datetime(2026, 11, 22, 14, 30, 5) + datetime.timedelta(milliseconds=i * 1001)
        out.append({
            "i": -i * 1000, "n": i * 10**12, "f": i / 4, "d": i / 3, "s": f"héllo-{i}", "b": bytes([i, 0, 255]),
            "flag": i % 2 == 0, "maybe": None if i % 3 == 0 else i,
            "inner": {"x": i, "y": None if i % 2 else f"y{i}"},
            "tags": [f"t{k}" for k in range(i % 4)], "counts": {f"k{k}": (None if k == 1 else k * 0.5) for k in range(i % 3)},
            "color": ["RED", "GREEN", "BLUE"][i % 3], "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=i),
            "ts_ms": at, "ts_us": None if i == 2 else at + datetime.timedelta(microseconds=7 * i),
            "amount": decimal.Decimal(f"{i - 3}.25"), "big": decimal.Decimal(f"-12345678901234567890.{i:04d}"),
        })
    return out


def typed_frame(spark, records):
    """The DataFrame of ``records`` (timestamps as UTC microseconds, so the session's time zone does not matter)."""
    from pyspark.sql import functions as F

    ddl = ROW_DDL.replace("ts_ms timestamp not null", "ts_ms bigint not null").replace("ts_us timestamp", "ts_us bigint")
    shifted = [{**r, "ts_ms": micros(r["ts_ms"]), "ts_us": None if r["ts_us"] is None else micros(r["ts_us"])}
               for r in records]
    df = spark.createDataFrame([tuple(r.values()) for r in shifted], ddl)
    return df.withColumn("ts_ms", F.timestamp_micros("ts_ms")).withColumn("ts_us", F.timestamp_micros("ts_us"))


def as_micros(df, column):
    """``df``'s struct ``column`` with its timestamps as UTC microseconds, collected as dicts."""
    from pyspark.sql import functions as F

    out = df.select(F.col(column).withField("ts_ms", F.unix_micros(f"{column}.ts_ms"))
                    .withField("ts_us", F.unix_micros(f"{column}.ts_us")).alias("r"))
    return [plain(r["r"]) for r in out.collect()]


def expected(records):
    return [{**r, "ts_ms": micros(r["ts_ms"]), "ts_us": None if r["ts_us"] is None else micros(r["ts_us"])}
            for r in records]


def test_to_avro_then_from_avro_round_trips_every_type(spark):
    from pyspark.sql import functions as F

    records = rows()
    df = typed_frame(spark, records)
    schema = json.dumps(ROW_SCHEMA)
    encoded = df.select(to_avro(F.struct(*df.columns), schema).alias("value"))
    bodies = [bytes(r["value"]) for r in encoded.collect()]
    # the bytes are Avro: fastavro reads them back to the records written
    for body, record in zip(bodies, records):
        read = fastavro_read(ROW_SCHEMA, body)
        assert read["s"] == record["s"] and read["inner"] == record["inner"] and read["amount"] == record["amount"]
        assert read["ts_ms"].replace(tzinfo=None) == record["ts_ms"] and read["big"] == record["big"]
    decoded = encoded.select(from_avro("value", schema).alias("r"))
    assert decoded.schema["r"].dataType.simpleString() == (
        "struct<i:int,n:bigint,f:float,d:double,s:string,b:binary,flag:boolean,maybe:bigint,inner:struct<x:int,"
        "y:string>,tags:array<string>,counts:map<string,double>,color:string,day:date,ts_ms:timestamp,ts_us:timestamp,"
        "amount:decimal(9,2),big:decimal(25,4)>"
    )
    assert as_micros(decoded, "r") == expected(records)


def test_to_avro_without_a_schema_derives_spark_s_and_round_trips(spark):
    """The derived schema is Spark's (SchemaConverters.toAvroType), written out here."""
    from pyspark.sql import functions as F

    records = rows()
    df = typed_frame(spark, records).drop("color")
    encoded = df.select(to_avro(F.struct(*df.columns)).alias("value"))

    def opt(t):
        return [t, "null"]

    derived = {
        "type": "record", "name": "topLevelRecord",
        "fields": [
            {"name": "i", "type": "int"}, {"name": "n", "type": "long"}, {"name": "f", "type": "float"},
            {"name": "d", "type": "double"}, {"name": "s", "type": "string"}, {"name": "b", "type": "bytes"},
            {"name": "flag", "type": "boolean"}, {"name": "maybe", "type": opt("long")},
            {"name": "inner", "type": {"type": "record", "name": "inner", "namespace": "topLevelRecord",
                                       "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": opt("string")}]}},
            {"name": "tags", "type": {"type": "array", "items": opt("string")}},
            {"name": "counts", "type": {"type": "map", "values": opt("double")}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "ts_us", "type": opt({"type": "long", "logicalType": "timestamp-micros"})},
            {"name": "amount", "type": {"type": "fixed", "name": "fixed", "namespace": "topLevelRecord.amount",
                                        "size": 4, "logicalType": "decimal", "precision": 9, "scale": 2}},
            {"name": "big", "type": {"type": "fixed", "name": "fixed", "namespace": "topLevelRecord.big",
                                     "size": 11, "logicalType": "decimal", "precision": 25, "scale": 4}},
        ],
    }
    bodies = [bytes(r["value"]) for r in encoded.collect()]
    assert [fastavro_read(derived, b)["s"] for b in bodies] == [r["s"] for r in records]
    decoded = encoded.select(from_avro("value", json.dumps(derived)).alias("r"))
    want = [{k: v for k, v in r.items() if k != "color"} for r in expected(records)]
    assert as_micros(decoded, "r") == want
    # a nullable primitive column: the union [type, null], nulls stay null
    ints = spark.createDataFrame([(1,), (None,), (-7,)], "v int")
    back = ints.select(from_avro(to_avro("v"), '["int", "null"]').alias("v"))
    assert [r["v"] for r in back.collect()] == [1, None, -7]
    encoded = [r["a"] for r in ints.select(to_avro("v").alias("a")).collect()]
    assert [None if a is None else bytes(a) for a in encoded] == [b"\x00\x02", None, b"\x00\x0d"]


def test_values_written_by_fastavro_decode_with_from_avro(spark):
    from pyspark.sql import functions as F

    records = rows(5)
    bodies = [fastavro_body(ROW_SCHEMA, r) for r in records]
    df = spark.createDataFrame([(b,) for b in bodies] + [(None,)], "value binary")
    decoded = df.select(from_avro(F.col("value"), json.dumps(ROW_SCHEMA)).alias("r"))
    assert as_micros(decoded, "r") == [*expected(records), None]
    # a primitive schema, and a reader schema resolving another writer's (option avroSchema)
    longs = spark.createDataFrame([(fastavro_body("long", v),) for v in (0, -1, 2**40)], "value binary")
    assert [r[0] for r in longs.select(from_avro("value", '"long"')).collect()] == [0, -1, 2**40]
    old = {"type": "record", "name": "V", "fields": [{"name": "id", "type": "int"}]}
    new = {"type": "record", "name": "V", "fields": [{"name": "id", "type": "long"},
                                                     {"name": "note", "type": "string", "default": "none"}]}
    evolved = spark.createDataFrame([(fastavro_body(old, {"id": 5}),)], "value binary").select(
        from_avro("value", json.dumps(old), {"avroSchema": json.dumps(new)}).alias("r"))
    assert [plain(r["r"]) for r in evolved.collect()] == [{"id": 5, "note": "none"}]


# ---------------------------------------------------------------------------
# modes and errors

POINT = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "int"}, {"name": "label", "type": "string"}]}


def damaged_bodies():
    """Four values: good, truncated, good, one with a byte left over."""
    good = [fastavro_body(POINT, {"x": i, "label": f"p{i}"}) for i in range(3)]
    return [good[0], good[1][:-2], good[2], good[0] + b"\x00"]


def test_permissive_gives_null_for_damaged_records_and_keeps_the_others(spark):
    df = spark.createDataFrame([(i, b) for i, b in enumerate(damaged_bodies())], "n int, value binary")
    out = df.select("n", from_avro("value", json.dumps(POINT), {"mode": "PERMISSIVE"}).alias("p")).orderBy("n")
    assert [(r["n"], plain(r["p"])) for r in out.collect()] == [
        (0, {"x": 0, "label": "p0"}), (1, None), (2, {"x": 2, "label": "p2"}), (3, None)]
    with pytest.raises(Exception, match=r"SchemaError: Malformed Avro record in from_avro \(mode FAILFAST\): a value "
                       r"of \d+ bytes \(0x"):
        df.select(from_avro("value", json.dumps(POINT))).collect()


def test_failfast_names_the_offset_of_the_record_in_a_raylog_dataframe(spark, raylog_client, make_topic):
    topic = make_topic(partitions=2)
    bodies = damaged_bodies()
    produce(raylog_client, topic, [(b"k", bodies[0]), (b"k", bodies[1]), (b"k", bodies[2])])
    df = raylog_spark.read_topic(spark, topic, client=raylog_client)
    located = [(r["partition"], r["offset"]) for r in df.collect() if bytes(r["value"]) == bodies[1]]
    assert len(located) == 1
    partition, offset = located[0]
    with pytest.raises(Exception, match=f"SchemaError: Malformed Avro record in from_avro .*: the value at partition "
                       f"{partition} offset {offset} does not decode: the bytes end before the value does"):
        df.select(from_avro("value", json.dumps(POINT), partition="partition", offset="offset")).collect()
    # the data is intact: PERMISSIVE reads the other records, the damaged one as null
    kept = df.select("offset", from_avro("value", json.dumps(POINT), {"mode": "PERMISSIVE"}, partition="partition",
                                         offset="offset").alias("p")).orderBy("offset")
    assert [plain(r["p"]) for r in kept.collect()] == [{"x": 0, "label": "p0"}, None, {"x": 2, "label": "p2"}]
    with pytest.raises(ConfigError, match="both partition= and offset="):
        from_avro("value", json.dumps(POINT), partition="partition")


def test_options_schemas_and_values_that_do_not_fit_are_refused(spark):
    from pyspark.sql import functions as F

    schema = json.dumps(POINT)
    with pytest.raises(ConfigError, match="no option 'nope'"):
        from_avro("value", schema, {"nope": "1"})
    with pytest.raises(ConfigError, match="FAILFAST or PERMISSIVE"):
        from_avro("value", schema, {"mode": "DROPMALFORMED"})
    with pytest.raises(ConfigError, match="CORRECTED"):
        from_avro("value", schema, {"datetimeRebaseMode": "LEGACY"})
    assert from_avro("value", schema, {"mode": "permissive", "datetimeRebaseMode": "CORRECTED"}) is not None
    with pytest.raises(SchemaError, match="not a valid Avro schema"):
        from_avro("value", '{"type": "record"}')
    with pytest.raises(SchemaError, match="cannot be read as option avroSchema"):
        from_avro("value", schema, {"avroSchema": '"string"'})
    df = spark.createDataFrame([(1, "a"), (2, None)], "x int, label string")
    with pytest.raises(Exception, match="SchemaError: cannot write field 'label' of the value of Spark type string as "
                       "Avro \"int\""):
        df.select(to_avro(F.struct("x", "label"), '{"type": "record", "name": "P", "fields": [{"name": "x", "type": '
                          '"int"}, {"name": "label", "type": "int"}]}')).collect()
    with pytest.raises(Exception, match="SchemaError: .*field 'z' is not in the struct"):
        df.select(to_avro(F.struct("x", "label"), json.dumps(
            {**POINT, "fields": [*POINT["fields"], {"name": "z", "type": "int"}]}))).collect()
    # the null label does not fit the schema's non-null string: the write fails naming the field
    with pytest.raises(Exception, match="SchemaError: to_avro: field 'label' of the value is null but its Avro schema "
                       "has no null branch"):
        df.select(to_avro(F.struct("x", "label"), schema)).collect()
    colors = spark.createDataFrame([("RED",), ("PINK",)], "c string")
    with pytest.raises(Exception, match="SchemaError: to_avro: the value 'PINK' is not a symbol of enum Color"):
        colors.select(to_avro("c", '{"type": "enum", "name": "Color", "symbols": ["RED"]}')).collect()


# ---------------------------------------------------------------------------
# Confluent framing through the registry

VISIT_V1 = {"type": "record", "name": "Visit", "fields": [{"name": "id", "type": "long"},
                                                          {"name": "page", "type": "string"}]}
VISIT_V2 = {"type": "record", "name": "Visit", "fields": [
    {"name": "id", "type": "long"}, {"name": "page", "type": "string"},
    {"name": "seconds", "type": nullable("double"), "default": None}]}


def test_confluent_framed_values_by_registry_subject(spark, raylog_client, make_topic):
    from pyspark.sql import functions as F

    topic = make_topic(partitions=1)
    subject = f"{topic}-value"
    v1 = AvroSerializer(registry(raylog_client), VISIT_V1, subject=subject)
    v2 = AvroSerializer(registry(raylog_client), VISIT_V2, subject=subject)
    produce(raylog_client, topic, [(None, v1({"id": 1, "page": "/a"})),
                                   (None, v2({"id": 2, "page": "/b", "seconds": 1.5})),
                                   (None, frame(v2.schema_id, b"\x08"))])  # a frame whose body ends early
    df = raylog_spark.read_topic(spark, topic, client=raylog_client)
    latest = df.select("offset", from_confluent_avro("value", subject, options={"mode": "PERMISSIVE"},
                                                     client=raylog_client).alias("v")).orderBy("offset")
    assert [plain(r["v"]) for r in latest.collect()] == [
        {"id": 1, "page": "/a", "seconds": None}, {"id": 2, "page": "/b", "seconds": 1.5}, None]
    first = df.select(from_confluent_avro("value", subject, version=1, options={"mode": "PERMISSIVE"}).alias("v"))
    assert first.schema["v"].dataType.simpleString() == "struct<id:bigint,page:string>"
    with pytest.raises(Exception, match="SchemaError: Malformed Avro record in from_confluent_avro .*: the value at "
                       "partition 0 offset 2 does not decode"):
        df.select(from_confluent_avro("value", subject, partition="partition", offset="offset")).collect()
    unknown = spark.createDataFrame([(frame(987_654, b"\x02"),)], "value binary")
    with pytest.raises(Exception, match="UnknownSchemaError: Malformed Avro record .*no schema is registered under "
                       "id 987654"):
        unknown.select(from_confluent_avro("value", subject)).collect()
    with pytest.raises(UnknownSchemaError, match="has no version 3"):
        from_confluent_avro("value", subject, version=3)
    with pytest.raises(ConfigError, match="one option is mode"):
        from_confluent_avro("value", subject, options={"avroSchema": "{}"})

    # to_confluent_avro: registers the schema given under the subject, or writes the subject's latest
    visits = spark.createDataFrame([(7, "/x", None), (8, "/y", 2.5)], "id bigint not null, page string not null, "
                                   "seconds double")
    subject3 = f"{topic}-copy"
    written = visits.select(to_confluent_avro(F.struct("id", "page", "seconds"), subject3, json.dumps(VISIT_V2),
                                              client=raylog_client).alias("value"))
    frames = [bytes(r["value"]) for r in written.collect()]
    assert registry(raylog_client).subject_version(subject3) == v2.schema_id  # the same schema: its id
    read = AvroDeserializer(registry(raylog_client))
    assert [read.deserialize(f) for f in frames] == [{"id": 7, "page": "/x", "seconds": None},
                                                     {"id": 8, "page": "/y", "seconds": 2.5}]
    again = visits.select(to_confluent_avro(F.struct("id", "page", "seconds"), subject).alias("value"))
    assert [bytes(r["value"]) for r in again.collect()] == frames  # the session's cluster, the subject's latest
    back = written.select(from_confluent_avro("value", subject3).alias("v"))
    assert [plain(r["v"]) for r in back.collect()] == [{"id": 7, "page": "/x", "seconds": None},
                                                       {"id": 8, "page": "/y", "seconds": 2.5}]
    with pytest.raises(UnknownSchemaError, match="no schema is registered under subject"):
        to_confluent_avro("id", f"{topic}-none")


def test_the_avro_functions_example_runs_as_written(spark, raylog_client, capsys):
    """The block of docs/howto/spark.md on the module's cluster (the session's), its topic
    "clicks-avro" created first; its last DataFrame read again once the partitions flushed."""
    import ray

    from tests.doc_blocks import block, printed_lines

    raylog_client.create_topic("clicks-avro", partitions=2)
    namespace = {"spark": spark}
    exec(compile(block("docs/howto/spark.md", "Avro columns: from_avro and to_avro"), "spark.md", "exec"), namespace)
    assert printed_lines(capsys.readouterr().out)[0] == "[('ann', 120), ('bob', 80)]"
    ray.get([raylog_client.partition_actor("clicks-avro", p).flush.remote() for p in range(2)])
    assert sorted(tuple(r) for r in namespace["typed"].select("click.*").collect()) == [("ann", 120), ("bob", 80)]
    frames = [bytes(r["value"]) for r in raylog_spark.read_topic(spark, "clicks-avro", client=raylog_client).collect()]
    read = AvroDeserializer(registry(raylog_client))
    assert sorted((v["user"], v["ms"]) for v in map(read.deserialize, frames)) == [("ann", 120), ("bob", 80)]
