"""Avro values in raylog messages, framed as Confluent's wire format.

A message ``value`` (or ``key``) that carries an Avro record is laid out as:

======  ============  ========================================================
bytes   field         meaning
======  ============  ========================================================
0       magic         u8, always 0 (:data:`MAGIC`)
1–4     schema id     u32, big-endian: the id the schema has in the cluster's
                      :class:`~raylog.zk.schemas.SchemaRegistry`
5–      body          the record in Avro binary encoding, without any Avro
                      container header ("schemaless", ``fastavro.schemaless_writer``)
======  ============  ========================================================

The 5-byte header is :data:`HEADER` (``struct`` format ``>BI``). The format
is the one Confluent's serializers write, so values can be read by tools
that know it, given the schema under the same id.

:class:`AvroSerializer` registers its schema once and writes frames;
:class:`AvroDeserializer` reads the id, fetches the writer's schema from the
registry (cached per id, parsed once) and decodes the body.
:func:`avro_to_spark_schema` maps an Avro schema to a Spark ``StructType``
for typed DataFrame columns; it imports pyspark only when called.
"""

from __future__ import annotations

import io
import struct
import threading
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.validation import validate

from raylog.errors import SchemaError
from raylog.zk.schemas import Schema, SchemaRegistry, load_schema
from raylog.zk.session import connect_kazoo

#: The first byte of every frame.
MAGIC = 0
#: magic (u8) and schema id (u32), big-endian.
HEADER = struct.Struct(">BI")


def schema_registry(zk, cluster: str) -> SchemaRegistry:
    """The schema registry of ``cluster`` over the ZooKeeper session ``zk``
    (``client.metadata.zk``, or one from :func:`open_schema_session`)."""
    return SchemaRegistry(zk, cluster)


def open_schema_session(zookeeper: str):
    """A ZooKeeper session of its own for reading schemas where no client
    runs (a Spark executor); ``stop()`` and ``close()`` it when done."""
    return connect_kazoo(zookeeper)


def frame(schema_id: int, body: bytes) -> bytes:
    """``body`` behind the 5-byte header naming ``schema_id``."""
    return HEADER.pack(MAGIC, schema_id) + body


def unframe(data: bytes) -> tuple[int, memoryview]:
    """Split a frame into ``(schema_id, body)``.

    Raises :class:`SchemaError` if ``data`` is shorter than the header or
    does not start with the magic byte.
    """
    if len(data) < HEADER.size:
        raise SchemaError(
            f"Avro frame too short: {len(data)} bytes, the header alone is {HEADER.size}; "
            "the value was not written by an AvroSerializer"
        )
    magic, schema_id = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SchemaError(
            f"Avro frame starts with magic byte {magic}, expected {MAGIC}; "
            "the value was not written by an AvroSerializer"
        )
    return schema_id, memoryview(data)[HEADER.size :]


class AvroSerializer:
    """Writes records of one schema as framed Avro.

    The schema is registered (or found, if already registered) when the
    serializer is created. Immutable after construction; safe to share
    between threads.
    """

    def __init__(self, registry, schema: Schema, subject: str | None = None):
        # with subject: the schema is also that subject's latest version
        # (SchemaRegistry.register), so readers can pick it by subject
        if subject is None:
            self.schema_id: int = registry.register(schema)
        else:
            self.schema_id = registry.register(schema, subject=subject)
        # Parse what the registry stored, so the writer uses exactly the
        # schema that readers will fetch under schema_id.
        self.schema = registry.get(self.schema_id)
        self._parsed = parse_schema(self.schema, named_schemas={})
        self._header = HEADER.pack(MAGIC, self.schema_id)

    def serialize(self, record: Any) -> bytes:
        """``record`` as a frame. Raises :class:`SchemaError`, naming the
        offending field, if ``record`` does not match the schema."""
        buf = io.BytesIO()
        buf.write(self._header)
        try:
            schemaless_writer(buf, self._parsed, record)
        except Exception as err:  # noqa: BLE001 - fastavro raises TypeError, ValueError, struct.error, ...
            raise SchemaError(self._mismatch(record, err), schema_id=self.schema_id) from None
        return buf.getvalue()

    __call__ = serialize

    def _mismatch(self, record: Any, err: Exception) -> str:
        # Only on failure: validate to find which field is wrong.
        from fastavro.validation import ValidationError

        try:
            validate(record, self._parsed, raise_errors=True)
        except ValidationError as verr:
            fields = sorted({str(e.field) for e in verr.errors if getattr(e, "field", None)})
            details = "; ".join(_describe(e) for e in verr.errors)
            where = "field " + ", ".join(fields) if fields else "the top level"
            return f"record does not match schema {self.schema_id} at {where}: {details}"
        except Exception:  # noqa: BLE001 - fall back to the writer's own message
            pass
        return f"record does not match schema {self.schema_id}: {type(err).__name__}: {err}"

    def __repr__(self) -> str:
        return f"AvroSerializer(schema_id={self.schema_id})"


class AvroDeserializer:
    """Reads framed Avro written under any schema of the registry.

    Writer schemas are fetched by id on first sight and kept, parsed, for
    the life of the deserializer (registered schemas never change). With
    ``reader_schema``, records are resolved to it (Avro schema evolution:
    fields added with defaults, fields removed, promoted types).

    Thread-safety: the cache is guarded by a lock; safe to share.
    """

    def __init__(self, registry, reader_schema: Schema | None = None):
        self._registry = registry
        self._reader = None if reader_schema is None else _parse(reader_schema)
        self._lock = threading.Lock()
        self._parsed: dict[int, Any] = {}

    def writer_schema(self, schema_id: int) -> Any:
        """The parsed writer schema for ``schema_id`` (fetched once, then cached).
        Raises :class:`~raylog.errors.UnknownSchemaError` for an id not registered."""
        with self._lock:
            parsed = self._parsed.get(schema_id)
        if parsed is None:
            parsed = parse_schema(self._registry.get(schema_id), named_schemas={})
            with self._lock:
                self._parsed.setdefault(schema_id, parsed)
        return parsed

    def deserialize(self, data: bytes) -> Any:
        """The record in frame ``data``.

        Raises :class:`SchemaError` for a frame too short or with a wrong
        magic byte, a body that does not decode under its schema, or bytes
        left over after the record; :class:`~raylog.errors.UnknownSchemaError`
        when the id is not registered.
        """
        schema_id, body = unframe(data)
        writer = self.writer_schema(schema_id)
        buf = io.BytesIO(body)
        try:
            record = schemaless_reader(buf, writer, self._reader)
        except Exception as err:  # noqa: BLE001 - EOFError, ValueError, UnicodeDecodeError, ...
            raise SchemaError(
                f"Avro body does not decode under schema {schema_id}: {type(err).__name__}: {err}; "
                "the value is corrupt or was framed with the wrong id",
                schema_id=schema_id,
            ) from None
        left = len(body) - buf.tell()
        if left:
            raise SchemaError(
                f"{left} bytes left after decoding a record of schema {schema_id}; "
                "the value is corrupt or was framed with the wrong id",
                schema_id=schema_id,
            )
        return record

    __call__ = deserialize

    def __repr__(self) -> str:
        return f"AvroDeserializer(cached_schemas={sorted(self._parsed)})"


def _parse(schema: Schema) -> Any:
    try:
        return parse_schema(load_schema(schema), named_schemas={})
    except SchemaError:
        raise
    except Exception as err:  # noqa: BLE001
        raise SchemaError(f"invalid Avro schema: {type(err).__name__}: {err}") from None


def _describe(error) -> str:
    where = f"field {error.field}" if getattr(error, "field", None) else "the record"
    got = "None (missing?)" if error.datum is None else repr(error.datum)
    return f"{where} got {got}, expected {_type_name(error.schema)}"


def _type_name(schema: Any) -> str:
    if isinstance(schema, dict):
        return schema.get("logicalType") or schema.get("name") or str(schema.get("type"))
    if isinstance(schema, list):
        return "one of " + ", ".join(_type_name(s) for s in schema)
    return str(schema)


# ----------------------------------------------------------------------------
# Avro -> Spark


def avro_to_spark_schema(schema: Schema):
    """The Spark ``StructType`` for records of Avro ``schema``.

    A record becomes a ``StructType`` with one field per Avro field; any
    other top-level schema becomes a one-field struct ``value``. Mapping:

    ===================================  =========================================
    Avro                                 Spark
    ===================================  =========================================
    null                                 NullType
    boolean, int, long, float, double    BooleanType, IntegerType, LongType, ...
    bytes, fixed                         BinaryType
    string, enum                         StringType
    array<T>                             ArrayType(T)
    map<T>                               MapType(StringType, T)
    record                               StructType
    [null, T] (either order)             T, nullable
    [int, long] / [float, double]        LongType / DoubleType (promoted)
    other unions                         StructType(member0, member1, ...), as spark-avro
    int date                             DateType
    long timestamp-millis / -micros      TimestampType
    long local-timestamp-millis/-micros  TimestampNTZType
    bytes/fixed decimal(p, s)            DecimalType(p, s), p ≤ 38
    ===================================  =========================================

    Other logical types (``time-millis``, ``uuid``, ...) map to their
    underlying type. Recursive records cannot be represented in Spark and
    raise :class:`SchemaError`, as does an invalid schema.
    """
    from pyspark.sql import types as T  # heavy (Spark): imported when used

    parsed = _parse(schema)
    named: dict[str, Any] = {}
    _collect_named(parsed, named)

    def convert(s: Any, stack: tuple[str, ...]) -> tuple[Any, bool]:
        """(Spark type, nullable) of Avro schema ``s``."""
        if isinstance(s, str):
            if s in named:
                return convert(named[s], stack)
            return _primitive_types(T)[s], s == "null"
        if isinstance(s, list):
            return convert_union(s, stack)
        kind = s["type"]
        logical = s.get("logicalType")
        if kind == "record" or kind == "error":
            name = s["name"]
            if name in stack:
                raise SchemaError(f"record {name} is recursive; Spark types cannot represent it")
            fields = []
            for f in s["fields"]:
                dtype, nullable = convert(f["type"], stack + (name,))
                fields.append(T.StructField(f["name"], dtype, nullable))
            return T.StructType(fields), False
        if kind == "enum":
            return T.StringType(), False
        if kind == "array":
            dtype, nullable = convert(s["items"], stack)
            return T.ArrayType(dtype, containsNull=nullable), False
        if kind == "map":
            dtype, nullable = convert(s["values"], stack)
            return T.MapType(T.StringType(), dtype, valueContainsNull=nullable), False
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(s["precision"]), int(s.get("scale", 0))
            if precision > 38:
                raise SchemaError(f"decimal precision {precision} exceeds Spark's maximum of 38")
            return T.DecimalType(precision, scale), False
        if kind == "fixed":
            return T.BinaryType(), False
        if kind == "int" and logical == "date":
            return T.DateType(), False
        if kind == "long" and logical in ("timestamp-millis", "timestamp-micros"):
            return T.TimestampType(), False
        if kind == "long" and logical in ("local-timestamp-millis", "local-timestamp-micros"):
            return T.TimestampNTZType(), False
        if isinstance(kind, (str, list, dict)) and kind != s:
            return convert(kind, stack)
        raise SchemaError(f"Avro type {s!r} has no Spark equivalent")  # pragma: no cover

    def convert_union(branches: list, stack: tuple[str, ...]) -> tuple[Any, bool]:
        has_null = any(b == "null" for b in branches)
        rest = [b for b in branches if b != "null"]
        if not rest:
            return T.NullType(), True
        if len(rest) == 1:
            dtype, nullable = convert(rest[0], stack)
            return dtype, has_null or nullable
        kinds = {b if isinstance(b, str) else None for b in rest}
        if kinds == {"int", "long"}:
            return T.LongType(), has_null
        if kinds == {"float", "double"}:
            return T.DoubleType(), has_null
        members = []
        for i, b in enumerate(rest):
            dtype, _ = convert(b, stack)
            members.append(T.StructField(f"member{i}", dtype, True))
        return T.StructType(members), has_null

    dtype, nullable = convert(parsed, ())
    if isinstance(dtype, T.StructType) and not isinstance(parsed, list):
        return dtype
    return T.StructType([T.StructField("value", dtype, nullable)])


def _collect_named(s: Any, named: dict[str, Any]) -> None:
    """Index every named type (record, enum, fixed) defined inside ``s`` by full name."""
    if isinstance(s, list):
        for b in s:
            _collect_named(b, named)
    elif isinstance(s, dict):
        if s.get("type") in ("record", "error", "enum", "fixed") and "name" in s:
            named.setdefault(s["name"], s)
        for f in s.get("fields", ()):
            _collect_named(f["type"], named)
        for key in ("items", "values"):
            if key in s:
                _collect_named(s[key], named)
        if isinstance(s.get("type"), (dict, list)):
            _collect_named(s["type"], named)


def _primitive_types(T) -> dict[str, Any]:
    return {
        "null": T.NullType(),
        "boolean": T.BooleanType(),
        "int": T.IntegerType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "bytes": T.BinaryType(),
        "string": T.StringType(),
    }
