"""Avro values as typed columns, decoded in Python: the ``mapInArrow``
path of ``read_topic(value_format="avro")`` (the Python reader), and the
driver-side checks of every typed Avro read.

Values are Confluent-framed Avro (:mod:`raylog.avro`). Each Spark task
decodes its batches with fastavro into the columns of one reader schema
(values of other writer schemas are resolved to it), then fixes the values
of logical types that Spark keeps as their underlying type (``uuid``:
string, ``time-millis``: int ms, ``time-micros``: long µs), which fastavro
returns as Python objects. The JVM reader (``org.raylog.spark.AvroReader``)
decodes into the same columns and values.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from raylog.avro import (
    HEADER,
    AvroDeserializer,
    avro_to_spark_schema,
    open_schema_session,
    schema_registry,
    unframe,
)
from raylog.errors import ConfigError
from raylog.read import ReadPlan, head_values, resolve_connection
from raylog_spark.columns import META_COLUMNS, typed_schema

#: values read on the driver to find an Avro schema id
DEFAULT_SAMPLE = 1000


class AvroColumns:
    """Decodes the ``value`` column of read batches (Confluent-framed Avro)
    into typed columns of one reader schema; shipped to the executors.

    Writer schemas known when planning travel with it; one registered after
    that is fetched from ZooKeeper by the executor that first meets it.
    Not thread-safe: each Spark task decodes with its own unpickled copy.
    """

    def __init__(self, settings, reader_id: int, schemas: dict[int, Any], flatten: bool = True):
        self.settings = settings
        self.reader_id = reader_id
        self.schemas = schemas
        self.flatten = flatten
        value_schema = avro_to_spark_schema(schemas[reader_id])
        _check_supported(schemas[reader_id])
        self.value_schema = value_schema
        self.spark_schema = typed_schema(value_schema, flatten)
        self._state = None

    @classmethod
    def for_plan(cls, plan: ReadPlan, *, client=None, schema_id=None, flatten=True, sample=DEFAULT_SAMPLE,
                 schema_subject=None, schema_version="latest"):
        if schema_subject is not None and schema_id is not None:
            raise ConfigError("pass schema_id= or schema_subject=, not both: each names the reader schema")
        if schema_id is None and schema_subject is None:
            first = head_values(plan, 1)
            if not first:
                raise ConfigError(
                    f"no messages in the read of {plan.topic!r} to take the Avro schema id from; pass schema_id="
                )
            schema_id, _ = unframe(first[0])
        metadata, settings, owned = resolve_connection(client, plan.settings)
        try:
            registry = schema_registry(metadata.zk, settings.cluster)
            if schema_subject is not None:
                schema_id = registry.subject_version(schema_subject, schema_version)  # UnknownSchemaError
            schemas = registry.list()
            schemas[schema_id] = registry.get(schema_id)  # UnknownSchemaError
        finally:
            if owned is not None:
                owned.close()
        return cls(settings, schema_id, schemas, flatten)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_state"] = None
        return state

    def _deserializers(self):
        if self._state is None:
            from pyspark.sql.pandas.types import to_arrow_schema  # pyspark: imported where Spark runs

            registry = _ShippedRegistry(self.settings, self.schemas)
            self._state = (
                registry,
                AvroDeserializer(registry),
                AvroDeserializer(registry, reader_schema=self.schemas[self.reader_id]),
                to_arrow_schema(self.value_schema),
                logical_fixer(self.schemas[self.reader_id]),
            )
        return self._state

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _registry, plain, resolving, arrow_schema, fix = self._deserializers()
        reader_id = self.reader_id
        unpack = HEADER.unpack_from
        records = []
        append = records.append
        nulls = []  # rows of null values (tombstones): null value columns, as the JVM reader gives them
        for value in batch.column(1).to_pylist():
            if value is None:
                nulls.append(len(records))
                append({})
            elif len(value) < 5:
                append(resolving.deserialize(value))  # SchemaError: not an Avro frame
            else:
                append((plain if unpack(value)[1] == reader_id else resolving).deserialize(value))
        if fix is not None:
            records = [r if not r else fix(r) for r in records]
        typed = pa.RecordBatch.from_pylist(records, schema=arrow_schema)
        meta = [batch.column(name) for name in META_COLUMNS]
        if self.flatten:
            columns = [*typed.columns, *meta]
            names = [*arrow_schema.names, *META_COLUMNS]
        else:
            mask = None
            if nulls:
                mask = [False] * len(records)
                for i in nulls:
                    mask[i] = True
                mask = pa.array(mask, pa.bool_())
            columns = [pa.StructArray.from_arrays(typed.columns, fields=list(arrow_schema), mask=mask), *meta]
            names = ["value", *META_COLUMNS]
        return pa.RecordBatch.from_arrays(columns, names=names)

    def close(self) -> None:
        if self._state is not None:
            self._state[0].close()
            self._state = None


class _ShippedRegistry:
    """The schemas shipped with a read, and ZooKeeper for any other id."""

    def __init__(self, settings, schemas: dict[int, Any]):
        self.settings = settings
        self.schemas = dict(schemas)
        self._zk = None

    def get(self, schema_id: int):
        found = self.schemas.get(schema_id)
        if found is None:
            if self._zk is None:
                self._zk = open_schema_session(self.settings.zookeeper)
            found = self.schemas[schema_id] = schema_registry(self._zk, self.settings.cluster).get(schema_id)
        return found

    def close(self) -> None:
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None


def _time_ms(t) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1000 + t.microsecond // 1000


def _time_us(t) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


#: logical types whose Python values (from fastavro) are not those of their
#: Spark type (the underlying Avro type, see raylog.avro.avro_to_spark_schema)
_LOGICAL_TO_SPARK = {"uuid": str, "time-millis": _time_ms, "time-micros": _time_us}


def logical_fixer(schema):
    """A function that turns the values of ``schema``'s logical types that
    Spark keeps as their underlying type (``uuid``: string,
    ``time-millis``: int, ``time-micros``: long) from fastavro's Python
    objects (``UUID``, ``datetime.time``) into those, in a decoded record; or
    None when the schema has none (nothing to do)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            pass
    named: dict[str, Any] = {}

    def collect(s):
        if isinstance(s, dict):
            if s.get("type") in ("record", "error", "enum", "fixed") and "name" in s:
                named[s["name"]] = s
                if "namespace" in s:
                    named[f"{s['namespace']}.{s['name']}"] = s
            for f in s.get("fields", ()):
                collect(f["type"])
            for key in ("items", "values", "type"):
                if isinstance(s.get(key), (dict, list)):
                    collect(s[key])
        elif isinstance(s, list):
            for b in s:
                collect(b)

    collect(schema)

    def build(s, seen=()):
        """The converter of one value of schema ``s``, or None (nothing to convert)."""
        if isinstance(s, str):
            if s in named and s not in seen:
                return build(named[s], seen + (s,))
            return None
        if isinstance(s, list):
            branches = [build(b, seen) for b in s if b != "null"]
            branches = [b for b in branches if b is not None]
            if not branches:
                return None
            if len(branches) == 1:
                one = branches[0]
                return lambda v: None if v is None else one(v)
            return lambda v: v  # several converting branches: unsupported unions are refused elsewhere
        kind = s.get("type")
        logical = s.get("logicalType")
        if logical in _LOGICAL_TO_SPARK and isinstance(kind, str):
            convert = _LOGICAL_TO_SPARK[logical]
            return lambda v: v if isinstance(v, (int, str)) else convert(v)
        if kind in ("record", "error"):
            fields = [(f["name"], build(f["type"], seen + (s.get("name"),))) for f in s.get("fields", ())]
            fields = [(n, c) for n, c in fields if c is not None]
            if not fields:
                return None

            def record(v):
                if v is None:
                    return None
                for name, conv in fields:
                    v[name] = conv(v.get(name))
                return v

            return record
        if kind == "array":
            item = build(s["items"], seen)
            return None if item is None else (lambda v: None if v is None else [item(x) for x in v])
        if kind == "map":
            value = build(s["values"], seen)
            return None if value is None else (lambda v: None if v is None else {k: value(x) for k, x in v.items()})
        if isinstance(kind, (dict, list)):
            return build(kind, seen)
        return None

    top = build(schema)
    if top is None:
        return None
    if isinstance(schema, dict) and schema.get("type") in ("record", "error"):
        return top
    return lambda r: {**r, "value": top(r["value"])} if isinstance(r, dict) and "value" in r else r


def _check_supported(schema) -> None:
    """Typed reads build Arrow columns from fastavro's records, which cannot
    represent a union of several non-null types (Spark's ``member0...``)."""

    def walk(s):
        if isinstance(s, list):
            rest = [b for b in s if b != "null"]
            kinds = {b if isinstance(b, str) else None for b in rest}
            if len(rest) > 1 and kinds not in ({"int", "long"}, {"float", "double"}):
                raise ConfigError(
                    "typed Avro reads do not support unions of several non-null types; read "
                    "value_format='binary' and decode the values with raylog.avro.AvroDeserializer"
                )
            for b in rest:
                walk(b)
        elif isinstance(s, dict):
            for f in s.get("fields", ()):
                walk(f["type"])
            for key in ("items", "values"):
                if key in s:
                    walk(s[key])
            if isinstance(s.get("type"), (dict, list)):
                walk(s["type"])

    walk(schema)
