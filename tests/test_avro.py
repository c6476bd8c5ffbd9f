"""Avro framing (Confluent's wire format) and the Avro -> Spark schema mapping.

The framing unit tests use a small in-memory registry; everything that
involves registering or resolving schemas goes through the real
:class:`SchemaRegistry` on the embedded ZooKeeper.
"""

from __future__ import annotations

import datetime
import decimal
import json
import struct
import sys

import pytest

from raylog.avro import (
    HEADER,
    MAGIC,
    AvroDeserializer,
    AvroSerializer,
    avro_to_spark_schema,
    frame,
    unframe,
)
from raylog.errors import SchemaError, UnknownSchemaError
from raylog.zk.schemas import SchemaRegistry, canonical_schema

USER = {
    "type": "record",
    "name": "User",
    "namespace": "example",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "scores", "type": {"type": "map", "values": "double"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["FREE", "PAID"]}},
        {
            "name": "address",
            "type": [
                "null",
                {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]},
            ],
            "default": None,
        },
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "birthday", "type": {"type": "int", "logicalType": "date"}},
        {
            "name": "balance",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
    ],
}

ALICE = {
    "id": 42,
    "name": "alice",
    "email": None,
    "tags": ["a", "b"],
    "scores": {"x": 1.5},
    "kind": "PAID",
    "address": {"city": "Paris"},
    "created": datetime.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=datetime.timezone.utc),
    "birthday": datetime.date(1990, 1, 2),
    "balance": decimal.Decimal("12.34"),
}


class MemoryRegistry:
    """A registry stand-in for the framing tests: ids from 7 upward, no ZooKeeper."""

    def __init__(self):
        self._by_id: dict[int, str] = {}

    def register(self, schema) -> int:
        _, text = canonical_schema(schema)
        for schema_id, known in self._by_id.items():
            if known == text:
                return schema_id
        schema_id = 7 + len(self._by_id)
        self._by_id[schema_id] = text
        return schema_id

    def get(self, schema_id: int):
        if schema_id not in self._by_id:
            raise UnknownSchemaError(f"no schema {schema_id}", schema_id=schema_id)
        return json.loads(self._by_id[schema_id])


@pytest.fixture
def memory():
    return MemoryRegistry()


@pytest.fixture
def schemas(zk, cluster_name):
    return SchemaRegistry(zk, cluster_name)


# ---------------------------------------------------------------------------
# framing: failures first


def test_short_frame_fails(memory):
    reader = AvroDeserializer(memory)
    for data in (b"", b"\x00", b"\x00\x00\x00\x00"):
        with pytest.raises(SchemaError, match="too short"):
            reader.deserialize(data)


def test_bad_magic_fails(memory):
    schema_id = memory.register("string")
    data = bytearray(AvroSerializer(memory, "string").serialize("hi"))
    data[0] = 1
    with pytest.raises(SchemaError, match="magic byte 1"):
        AvroDeserializer(memory).deserialize(bytes(data))
    assert schema_id == 7


def test_truncated_body_fails(memory):
    data = AvroSerializer(memory, USER).serialize(ALICE)
    with pytest.raises(SchemaError, match="does not decode"):
        AvroDeserializer(memory).deserialize(data[:-3])


def test_trailing_bytes_fail(memory):
    data = AvroSerializer(memory, "long").serialize(5)
    with pytest.raises(SchemaError, match="1 bytes left"):
        AvroDeserializer(memory).deserialize(data + b"\x00")


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("id", "forty-two", "long"),
        ("name", None, "string"),
        ("kind", "GOLD", "example.Kind"),
        ("tags", [1], "string"),
    ],
)
def test_record_not_matching_schema_names_the_field(memory, field, value, expected):
    bad = dict(ALICE, **{field: value})
    with pytest.raises(SchemaError) as info:
        AvroSerializer(memory, USER).serialize(bad)
    message = str(info.value)
    assert f"example.User.{field}" in message
    assert expected in message


def test_missing_field_is_reported(memory):
    bad = {k: v for k, v in ALICE.items() if k != "name"}
    with pytest.raises(SchemaError, match=r"example\.User\.name got None \(missing\?\)"):
        AvroSerializer(memory, USER).serialize(bad)


def test_non_record_value_is_reported(memory):
    with pytest.raises(SchemaError, match="top level"):
        AvroSerializer(memory, USER).serialize(["not", "a", "record"])


# framing: the layout


def test_frame_layout_is_magic_then_big_endian_id_then_body(memory):
    memory.register("int")
    memory.register("long")
    serializer = AvroSerializer(memory, "string")
    data = serializer.serialize("hé")
    assert serializer.schema_id == 9
    assert data[0] == MAGIC == 0
    assert data[1:5] == struct.pack(">I", 9) == b"\x00\x00\x00\x09"
    # Avro string: zig-zag varint length (3 bytes -> 6), then UTF-8
    assert data[5:] == b"\x06" + "hé".encode("utf-8")
    assert HEADER.size == 5


def test_frame_and_unframe_are_inverse():
    data = frame(0x01020304, b"body")
    assert data == b"\x00\x01\x02\x03\x04body"
    schema_id, body = unframe(data)
    assert schema_id == 0x01020304 and bytes(body) == b"body"


def test_round_trip_with_logical_types(memory):
    data = AvroSerializer(memory, USER).serialize(ALICE)
    assert AvroDeserializer(memory).deserialize(data) == ALICE


def test_deserializer_parses_each_schema_once(memory):
    calls = []

    class Counting(MemoryRegistry):
        def get(self, schema_id):
            calls.append(schema_id)
            return super().get(schema_id)

    registry = Counting()
    writer = AvroSerializer(registry, "long")
    calls.clear()
    reader = AvroDeserializer(registry)
    assert [reader.deserialize(writer.serialize(n)) for n in range(5)] == list(range(5))
    assert calls == [writer.schema_id]


# ---------------------------------------------------------------------------
# through the real schema registry


def test_unknown_schema_id_fails(schemas):
    with pytest.raises(UnknownSchemaError) as info:
        AvroDeserializer(schemas).deserialize(frame(999, b"\x02"))
    assert info.value.schema_id == 999


def test_round_trip_through_zookeeper(schemas, make_zk, cluster_name):
    writer = AvroSerializer(schemas, USER)
    data = writer.serialize(ALICE)
    assert struct.unpack(">I", data[1:5])[0] == writer.schema_id
    # a reader in another process would have its own registry and cache
    reader = AvroDeserializer(SchemaRegistry(make_zk(), cluster_name))
    assert reader.deserialize(data) == ALICE


def test_serializers_of_one_schema_share_its_id(schemas):
    assert AvroSerializer(schemas, USER).schema_id == AvroSerializer(schemas, json.dumps(USER)).schema_id


def test_invalid_schema_fails_at_construction(schemas):
    with pytest.raises(SchemaError, match="invalid Avro schema"):
        AvroSerializer(schemas, {"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]})


def test_reader_schema_resolves_an_older_writer(schemas):
    v1 = {"type": "record", "name": "Click", "fields": [{"name": "user", "type": "string"}]}
    v2 = {
        "type": "record",
        "name": "Click",
        "fields": [
            {"name": "user", "type": "string"},
            {"name": "page", "type": "string", "default": "/"},
        ],
    }
    old = AvroSerializer(schemas, v1).serialize({"user": "u1"})
    new = AvroSerializer(schemas, v2).serialize({"user": "u2", "page": "/a"})
    reader = AvroDeserializer(schemas, reader_schema=v2)
    assert reader.deserialize(old) == {"user": "u1", "page": "/"}
    assert reader.deserialize(new) == {"user": "u2", "page": "/a"}
    # without a reader schema each record comes back as written
    assert AvroDeserializer(schemas).deserialize(old) == {"user": "u1"}


# ---------------------------------------------------------------------------
# Avro -> Spark types (no Spark session needed)


def test_avro_module_does_not_import_pyspark():
    import subprocess

    code = "import sys, raylog.avro; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_avro_to_spark_schema_maps_every_kind():
    from pyspark.sql import types as T

    got = avro_to_spark_schema(USER)
    expected = T.StructType(
        [
            T.StructField("id", T.LongType(), False),
            T.StructField("name", T.StringType(), False),
            T.StructField("email", T.StringType(), True),
            T.StructField("tags", T.ArrayType(T.StringType(), False), False),
            T.StructField("scores", T.MapType(T.StringType(), T.DoubleType(), False), False),
            T.StructField("kind", T.StringType(), False),
            T.StructField("address", T.StructType([T.StructField("city", T.StringType(), False)]), True),
            T.StructField("created", T.TimestampType(), False),
            T.StructField("birthday", T.DateType(), False),
            T.StructField("balance", T.DecimalType(10, 2), False),
        ]
    )
    assert got == expected


def test_avro_to_spark_schema_unions_and_references():
    from pyspark.sql import types as T

    schema = {
        "type": "record",
        "name": "Event",
        "fields": [
            {"name": "n", "type": ["int", "long"]},
            {"name": "x", "type": ["null", "float", "double"]},
            {"name": "either", "type": ["string", "long"]},
            {"name": "home", "type": {"type": "record", "name": "Place", "fields": [{"name": "c", "type": "string"}]}},
            {"name": "work", "type": ["Place", "null"]},
            {"name": "hash", "type": {"type": "fixed", "name": "MD5", "size": 16}},
            {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        ],
    }
    got = {f.name: (f.dataType, f.nullable) for f in avro_to_spark_schema(schema).fields}
    place = T.StructType([T.StructField("c", T.StringType(), False)])
    assert got == {
        "n": (T.LongType(), False),
        "x": (T.DoubleType(), True),
        "either": (
            T.StructType([T.StructField("member0", T.StringType(), True), T.StructField("member1", T.LongType(), True)]),
            False,
        ),
        "home": (place, False),
        "work": (place, True),
        "hash": (T.BinaryType(), False),
        "local": (T.TimestampNTZType(), False),
        "id": (T.StringType(), False),
    }


def test_avro_to_spark_schema_wraps_non_records():
    from pyspark.sql import types as T

    assert avro_to_spark_schema("string") == T.StructType([T.StructField("value", T.StringType(), False)])
    assert avro_to_spark_schema('["null", "long"]') == T.StructType([T.StructField("value", T.LongType(), True)])


def test_avro_to_spark_schema_rejects_what_spark_cannot_hold():
    recursive = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "next", "type": ["null", "Node"]}],
    }
    with pytest.raises(SchemaError, match="recursive"):
        avro_to_spark_schema(recursive)
    wide = {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0}
    with pytest.raises(SchemaError, match="38"):
        avro_to_spark_schema(wide)
    with pytest.raises(SchemaError, match="invalid Avro schema"):
        avro_to_spark_schema({"type": "nope"})
