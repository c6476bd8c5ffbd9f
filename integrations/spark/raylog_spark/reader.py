"""Topics as Spark DataFrames: ``read_topic`` and the DataFrame of a read plan.

::

    client = raylog.connect()
    spark = raylog_spark.init_spark()
    df = raylog_spark.read_topic(spark, "clicks", client=client)
    df.groupBy("partition").count().show()

How a read runs:

1. On the driver, :func:`raylog.read.data.plan_read` snapshots each partition's
   log start and high watermark once and fixes the byte ranges to read
   (validating explicit offsets, reporting or refusing lost data, splitting
   ranges for ``min_partitions`` at message boundaries). The plan, with the
   partitions' endpoints, is a small picklable value.
2. The executors read the ranges, one Spark partition per range, each
   preferring the node that holds the range's partition (Spark's scheduler
   runs the read there when an executor runs there; ``spark.locality.wait``
   bounds how long it waits for one). Two engines read:

   * ``"jvm"``: the Spark data source ``raylog`` (Java, built by
     :mod:`raylog_spark.jvm`, added to the session by ``init_spark``) runs
     in the executors' JVMs: ``spark.read.format("raylog")`` with the plan's
     ranges as an option; it fetches from the data sockets, checks every
     message's CRC32C, unpacks compressed wrappers and builds Spark rows
     without any Python worker. A query that needs no column (a count)
     copies no key or value, but still fetches and checks every message.
   * ``"python"``: ``mapInArrow`` runs :func:`raylog.read.data.read_range` in
     Spark's Python workers over a DataFrame of range numbers (RayDP's
     ``RayObjectRefRDD`` gives each its node as preferred location) and
     hands Arrow RecordBatches to Spark. It pays for Python workers (about
     0.3 s per job on a small machine, more than the whole JVM read of a
     million messages) and is the fallback when the JVM reader is missing.

   ``engine="auto"`` (the default) takes the JVM reader when the session
   loads it. ``value_format="json"`` parses the value column with Spark's
   ``from_json`` on either engine. ``value_format="avro"`` always decodes in
   Python (fastavro), and then reads with the Python reader in the same
   pass: the values would reach Python anyway, and fetching them there
   costs less than shipping them from the JVM to the Python workers.

The DataFrame is as repeatable as its plan: every action over it reads the
same ranges (unless retention deleted them meanwhile, see
``fail_on_data_loss``). Plan again (call ``read_topic`` again) to see new data.
Errors the executors meet (data lost since planning, a corrupt message, a
partition actor that moved) fail the Spark job with the raylog error's
name at the start of the message, e.g. ``DataLossError: ...``.

Columns (Spark's Kafka source): ``key`` binary, ``value`` binary, ``topic``
string, ``partition`` int, ``offset`` long (the byte offset; the inner
messages of a compressed set carry the wrapper's), ``timestamp`` timestamp.
With ``value_format="json"`` or ``"avro"`` the value's fields replace
``value`` as top-level columns (``flatten=False``: one struct column
``value``).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
from typing import Any, Iterator

import pyarrow as pa

from raylog.read.data import FETCH_BYTES, ReadPlan, plan_read, read_range, resolve_connection
from raylog.errors import ConfigError, SchemaError

log = logging.getLogger(__name__)

VALUE_FORMATS = ("binary", "json", "avro")
ENGINES = ("auto", "jvm", "python")
#: the columns every read returns besides the value
META_COLUMNS = ("key", "topic", "partition", "offset", "timestamp")
#: values read on the driver to infer a JSON schema or find an Avro schema id
DEFAULT_SAMPLE = 1000


def spark_schema():
    """The Spark schema of a binary read (Spark's Kafka source)."""
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("key", T.BinaryType(), True),
            T.StructField("value", T.BinaryType(), True),
            T.StructField("topic", T.StringType(), True),
            T.StructField("partition", T.IntegerType(), True),
            T.StructField("offset", T.LongType(), True),
            T.StructField("timestamp", T.TimestampType(), True),
        ]
    )


def read_topic(
    spark,
    topic: str,
    starting_offsets="earliest",
    ending_offsets="latest",
    value_format: str = "binary",
    *,
    min_partitions: int | None = None,
    fail_on_data_loss: bool = True,
    client=None,
    settings=None,
    schema=None,
    schema_id: int | None = None,
    json_options: dict | None = None,
    flatten: bool = True,
    sample: int = DEFAULT_SAMPLE,
    locality: bool = True,
    fetch_bytes: int = FETCH_BYTES,
    engine: str = "auto",
):
    """``topic`` as a DataFrame: the messages between ``starting_offsets``
    and ``ending_offsets``, fixed when this is called.

    Offsets, ``min_partitions`` and ``fail_on_data_loss`` are those of
    :func:`raylog.read.data.plan_read`; ``client`` (a :class:`raylog.Client`) or
    ``settings`` (its ``client.settings``) say which cluster to read; with
    neither, the cluster ``raylog.connect()`` made in this process (or
    ``RAYLOG_ZOOKEEPER``, see :func:`raylog.read.data.default_settings`).

    ``value_format``:

    * ``"binary"``: the Kafka-source columns;
    * ``"json"``: values parsed with Spark's ``from_json``, under ``schema``
      (a StructType or DDL string) or a schema Spark infers from the first
      ``sample`` values; ``json_options`` go to ``from_json``;
    * ``"avro"``: values in Confluent framing decoded into typed columns of
      the registered schema ``schema_id`` (default: the schema of the first
      message). Values written under other schemas are resolved to it (Avro
      schema evolution).

    ``engine``: ``"jvm"`` (the Spark data source ``raylog``; ConfigError
    when the session cannot load it), ``"python"`` (``mapInArrow``) or
    ``"auto"`` (the JVM reader when the session loads it); see the module
    docstring. The engine used is ``df.raylog_engine``.

    The plan is kept as ``df.raylog_plan`` (:class:`raylog.read.data.ReadPlan`:
    offsets, ranges and the lost ranges skipped). Errors that can be found
    on the driver are raised here: unknown topic, an offset off a message
    boundary or past the end, lost data, an unknown schema id.
    """
    if value_format not in VALUE_FORMATS:
        raise ConfigError(f"value_format must be one of {VALUE_FORMATS}, got {value_format!r}")
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    plan = plan_read(
        topic,
        starting_offsets,
        ending_offsets,
        min_partitions=min_partitions,
        fail_on_data_loss=fail_on_data_loss,
        client=client,
        settings=settings,
    )
    for gone in plan.lost:
        log.warning("read_topic(%r) skips %s", topic, gone.describe())
    df = plan_dataframe(
        spark,
        plan,
        value_format,
        client=client,
        schema=schema,
        schema_id=schema_id,
        json_options=json_options,
        flatten=flatten,
        sample=sample,
        locality=locality,
        fetch_bytes=fetch_bytes,
        engine=engine,
    )
    df.raylog_plan = plan
    return df


def plan_dataframe(
    spark,
    plan: ReadPlan,
    value_format: str = "binary",
    *,
    client=None,
    schema=None,
    schema_id: int | None = None,
    json_options: dict | None = None,
    flatten: bool = True,
    sample: int = DEFAULT_SAMPLE,
    locality: bool = True,
    fetch_bytes: int = FETCH_BYTES,
    engine: str = "auto",
):
    """The DataFrame that reads ``plan`` (see :func:`read_topic`); the
    engine that reads it is ``df.raylog_engine``."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    if value_format not in VALUE_FORMATS:
        raise ConfigError(f"value_format must be one of {VALUE_FORMATS}, got {value_format!r}")
    options = {
        "fail_on_data_loss": plan.fail_on_data_loss,
        "fetch_bytes": fetch_bytes,
        "max_message_bytes": plan.max_message_bytes,
    }
    if value_format == "avro":
        if engine == "jvm":
            raise ConfigError(
                "value_format='avro' decodes in Python and reads with the Python reader; pass engine='auto' "
                "or 'python', or read value_format='binary' with engine='jvm' and decode the values yourself"
            )
        decoder = AvroColumns.for_plan(plan, client=client, schema_id=schema_id, flatten=flatten, sample=sample)
        df = _ranges_dataframe(spark, plan, locality).mapInArrow(
            functools.partial(read_indexed_ranges, plan.ranges, plan.settings, options, decoder),
            decoder.spark_schema,
        )
        df.raylog_engine = "python"
        return df
    if _use_jvm(spark, engine):
        df = jvm_dataframe(spark, plan, locality=locality, fetch_bytes=fetch_bytes)
        used = "jvm"
    else:
        df = _ranges_dataframe(spark, plan, locality).mapInArrow(
            functools.partial(read_indexed_ranges, plan.ranges, plan.settings, options, None), spark_schema()
        )
        used = "python"
    if value_format == "json":
        df = _parse_json(spark, df, plan, schema, json_options, flatten, sample)
    df.raylog_engine = used
    return df


def _use_jvm(spark, engine: str) -> bool:
    if engine == "python":
        return False
    from raylog_spark import jvm

    if jvm.loadable(spark):
        return True
    if engine == "jvm":
        raise ConfigError(
            f"this Spark session cannot load the raylog data source ({jvm.SOURCE_CLASS}); start the session "
            f"with raylog_spark.init_spark (which adds its jar), add raylog_spark.jvm.jar_path() to spark.jars "
            f"and spark.driver.extraClassPath, or read with engine='python'"
        )
    log.info("the Spark session cannot load %s; reading with the Python reader", jvm.SOURCE_CLASS)
    return False


def jvm_options(plan: ReadPlan, *, locality: bool = True, fetch_bytes: int = FETCH_BYTES) -> dict[str, str]:
    """The options of the Spark data source ``raylog`` that reads ``plan``
    (the JVM reader; see ``org.raylog.spark.ReadOptions``)."""
    ranges = [
        {
            "topic": r.topic,
            "partition": r.partition,
            "start": r.start,
            "end": r.end,
            "host": r.host,
            "port": r.port,
            "location": r.node_ip if locality else None,
        }
        for r in plan.ranges
    ]
    options = {
        "ranges": json.dumps(ranges, separators=(",", ":")),
        "fetch_bytes": str(int(fetch_bytes)),
        "max_message_bytes": str(int(plan.max_message_bytes)),
        "fail_on_data_loss": "true" if plan.fail_on_data_loss else "false",
        "locality": "true" if locality else "false",
        # readers look a moved partition up again here
        "zookeeper": plan.settings.zookeeper,
        "cluster": plan.settings.cluster,
    }
    token = plan.settings.token
    if token:
        options["token"] = base64.b64encode(bytes(token)).decode("ascii")
    return options


def jvm_dataframe(spark, plan: ReadPlan, *, locality: bool = True, fetch_bytes: int = FETCH_BYTES):
    """The DataFrame of ``plan`` read by the JVM reader (binary values, the
    columns of :func:`spark_schema`)."""
    from raylog_spark.jvm import FORMAT

    df = spark.read.format(FORMAT).options(**jvm_options(plan, locality=locality, fetch_bytes=fetch_bytes)).load()
    return df.select(*spark_schema().fieldNames())


#: the Spark conf keys the data source ``raylog`` reads its cluster from when
#: a read by name has no ``zookeeper``/``cluster``/``token`` option
CLUSTER_CONF = ("spark.raylog.zookeeper", "spark.raylog.cluster", "spark.raylog.token")


def use_cluster(spark, client=None, settings=None) -> bool:
    """Make ``client``'s cluster (default: the one ``raylog.connect()`` made
    in this process, or ``RAYLOG_ZOOKEEPER``) the cluster of
    ``spark.read.format("raylog")`` and ``spark.readStream.format("raylog")``
    in this session: sets the session's ``spark.raylog.zookeeper``,
    ``spark.raylog.cluster`` and ``spark.raylog.token`` (base64).
    :func:`raylog_spark.init_spark` calls it. Returns False when there is no
    cluster to use (nothing is set)."""
    from raylog.read.data import default_settings

    if client is not None:
        settings = client.settings
    if settings is None:
        settings = default_settings()
    if settings is None:
        return False
    conf = spark.conf
    conf.set(CLUSTER_CONF[0], settings.zookeeper)
    conf.set(CLUSTER_CONF[1], settings.cluster)
    if settings.token:
        conf.set(CLUSTER_CONF[2], base64.b64encode(bytes(settings.token)).decode("ascii"))
    else:
        conf.unset(CLUSTER_CONF[2])
    return True


def _ranges_dataframe(spark, plan: ReadPlan, locality: bool):
    """One row (``idx``, the range's index) and one Spark partition per range,
    preferring the node that holds the range's partition."""
    from pyspark.sql import DataFrame

    count = len(plan.ranges)
    if count and locality and all(r.node_ip for r in plan.ranges):
        try:
            from ray.core.generated.common_pb2 import Address

            locations = [Address(ip_address=r.node_ip).SerializeToString() for r in plan.ranges]
            reader = spark.sparkContext._jvm.org.apache.spark.sql.raydp.ObjectStoreReader
            return DataFrame(reader.createRayObjectRefDF(spark._jsparkSession, locations), spark)
        except Exception as err:  # noqa: BLE001 - no RayDP reader class: read without a preference
            log.info("reading %s without locality preferences: %s", plan.topic, err)
    return spark.range(0, count, 1, max(1, count)).selectExpr("CAST(id AS INT) AS idx")


def read_indexed_ranges(ranges, settings, options: dict, decoder, batches: Iterator[pa.RecordBatch]):
    """The ``mapInArrow`` function of a read: for each range index in the
    input, the range's messages as RecordBatches (typed by ``decoder``)."""
    try:
        for batch in batches:
            for idx in batch.column(0).to_pylist():
                for out in read_range(ranges[idx], settings, **options):
                    yield out if decoder is None else decoder.decode(out)
    finally:
        if decoder is not None:
            decoder.close()


# ----------------------------------------------------------------------------
# JSON


def _parse_json(spark, df, plan: ReadPlan, schema, json_options, flatten: bool, sample: int):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if schema is None:
        from raylog.read.data import head_values

        values = [v.decode("utf-8", "replace") for v in head_values(plan, sample)]
        if not values:
            raise ConfigError(
                f"no messages to infer a JSON schema from in the read of {plan.topic!r}; pass schema="
            )
        schema = spark.read.json(spark.sparkContext.parallelize(values, 1)).schema
        if "_corrupt_record" in schema.fieldNames():
            raise SchemaError(
                f"the first values of {plan.topic!r} are not all JSON objects; pass schema= "
                f"(a StructType or DDL string) or read value_format='binary'"
            )
    elif isinstance(schema, str):
        schema = T._parse_datatype_string(schema)
    if not isinstance(schema, T.StructType):
        raise ConfigError(f"a JSON schema must be a StructType or a DDL string, got {type(schema).__name__}")
    parsed = F.from_json(F.col("value").cast("string"), schema, json_options or {})
    return _typed(df.select(parsed.alias("value"), *META_COLUMNS), schema, flatten)


def _typed(df, schema, flatten: bool):
    if not flatten:
        return df.select("value", *META_COLUMNS)
    clash = sorted(set(schema.fieldNames()) & set(META_COLUMNS))
    if clash:
        raise ConfigError(
            f"value fields {clash} have the names of the read's own columns; pass flatten=False "
            f"(the value as one struct column) and select what you need"
        )
    return df.select("value.*", *META_COLUMNS)


# ----------------------------------------------------------------------------
# Avro


class AvroColumns:
    """Decodes the ``value`` column of read batches (Confluent-framed Avro)
    into typed columns of one reader schema; shipped to the executors.

    Writer schemas known when planning travel with it; one registered after
    that is fetched from ZooKeeper by the executor that first meets it.
    Not thread-safe: each Spark task decodes with its own unpickled copy.
    """

    def __init__(self, settings, reader_id: int, schemas: dict[int, Any], flatten: bool = True):
        from raylog.avro import avro_to_spark_schema

        self.settings = settings
        self.reader_id = reader_id
        self.schemas = schemas
        self.flatten = flatten
        value_schema = avro_to_spark_schema(schemas[reader_id])
        _check_supported(schemas[reader_id])
        self.value_schema = value_schema
        self.spark_schema = _output_schema(value_schema, flatten)
        self._state = None

    @classmethod
    def for_plan(cls, plan: ReadPlan, *, client=None, schema_id=None, flatten=True, sample=DEFAULT_SAMPLE):
        from raylog.avro import unframe
        from raylog.read.data import head_values
        from raylog.zk.schemas import SchemaRegistry

        if schema_id is None:
            first = head_values(plan, 1)
            if not first:
                raise ConfigError(
                    f"no messages in the read of {plan.topic!r} to take the Avro schema id from; pass schema_id="
                )
            schema_id, _ = unframe(first[0])
        metadata, settings, owned = resolve_connection(client, plan.settings)
        try:
            registry = SchemaRegistry(metadata.zk, settings.cluster)
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
            from pyspark.sql.pandas.types import to_arrow_schema

            from raylog.avro import AvroDeserializer

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
        from raylog.avro import HEADER

        _registry, plain, resolving, arrow_schema, fix = self._deserializers()
        reader_id = self.reader_id
        unpack = HEADER.unpack_from
        records = []
        append = records.append
        for value in batch.column(1).to_pylist():
            if len(value) < 5:
                append(resolving.deserialize(value))  # SchemaError: not an Avro frame
            else:
                append((plain if unpack(value)[1] == reader_id else resolving).deserialize(value))
        if fix is not None:
            records = [fix(r) for r in records]
        typed = pa.RecordBatch.from_pylist(records, schema=arrow_schema)
        meta = [batch.column(name) for name in META_COLUMNS]
        if self.flatten:
            columns = [*typed.columns, *meta]
            names = [*arrow_schema.names, *META_COLUMNS]
        else:
            columns = [pa.StructArray.from_arrays(typed.columns, fields=list(arrow_schema)), *meta]
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
            from raylog.zk.schemas import SchemaRegistry
            from raylog.zk.server import connect_kazoo

            if self._zk is None:
                self._zk = connect_kazoo(self.settings.zookeeper)
            found = self.schemas[schema_id] = SchemaRegistry(self._zk, self.settings.cluster).get(schema_id)
        return found

    def close(self) -> None:
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None


def _output_schema(value_schema, flatten: bool):
    from pyspark.sql import types as T

    meta = [f for f in spark_schema().fields if f.name in META_COLUMNS]
    if not flatten:
        return T.StructType([T.StructField("value", value_schema, True), *meta])
    clash = sorted(set(value_schema.fieldNames()) & set(META_COLUMNS))
    if clash:
        raise ConfigError(
            f"value fields {clash} have the names of the read's own columns; pass flatten=False "
            f"(the value as one struct column) and select what you need"
        )
    return T.StructType([*value_schema.fields, *meta])


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
    import json as _json

    if isinstance(schema, str):
        try:
            schema = _json.loads(schema)
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
