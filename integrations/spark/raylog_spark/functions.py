"""Avro column functions with the signatures and semantics of Spark's
``pyspark.sql.avro.functions`` (the spark-avro package, which raylog does
not need), and their Confluent-framed variants bound to raylog's schema
registry. They run in raylog's jar (``org.raylog.spark.FromAvro``,
``ToAvro``): the session must load it (:func:`raylog_spark.init_spark`
does).

::

    from raylog_spark.functions import from_avro, to_avro, from_confluent_avro, to_confluent_avro

    encoded = df.select(to_avro(struct("id", "name")).alias("value"))      # Avro binary, schema derived
    decoded = encoded.select(from_avro("value", schema_json).alias("user"))  # struct<id, name>
    framed = df.select(to_confluent_avro(struct("id", "name"), "users-value", schema_json).alias("value"))
    users = raylog_df.select(from_confluent_avro("value", "users-value", partition="partition", offset="offset"))

Types (Avro to Spark, ``from_avro``): those of ``raylog.avro.avro_to_spark_schema``
(records are structs, enums strings, ``[null, T]`` a nullable T, date,
timestamp-millis/-micros, local-timestamp-*, decimal); ``to_avro`` writes
each Spark type as Spark does (see ``org.raylog.spark.AvroEncoders``) and,
without a schema, derives one as Spark does (a struct is the record
``topLevelRecord``, a nullable column the union ``[type, null]``, a
timestamp a long ``timestamp-micros``, a decimal a fixed ``decimal``).

Modes (option ``mode``, as Spark's): ``FAILFAST`` (default) fails the job
at the first value that does not decode, with a ``SchemaError`` (an
``UnknownSchemaError`` for a frame of an unregistered id); ``PERMISSIVE``
gives null for that value and decodes the others. Unlike Spark, bytes left
after a value count as a value that does not decode (Spark ignores them).

Which record failed: Spark's column functions see one value, not the row.
The decoding functions therefore take the position of the value as two
optional column arguments, ``partition=`` and ``offset=`` (the columns of a
raylog DataFrame: ``partition="partition", offset="offset"``); with them a
FAILFAST error names ``partition P offset O``, without them the value's size
and first bytes.

Errors found on the driver (an unknown option, a schema that does not
parse, a column type the schema cannot hold, an unknown subject) are
raylog's typed errors (``ConfigError``, ``SchemaError``,
``UnknownSchemaError``); those met in the executors fail the Spark job
with a message that starts with the raylog error's class name.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from raylog.avro import schema_registry
from raylog.errors import ConfigError, RaylogError, error_for_code
from raylog.read import default_settings, resolve_connection
from raylog.metadata import ConnectionSettings

__all__ = ["from_avro", "to_avro", "from_confluent_avro", "to_confluent_avro"]

#: the Java class of raylog's errors met in the JVM (its message starts with the error's class name)
_JAVA_ERROR = "org.raylog.spark.RaylogReadException"


def from_avro(data, jsonFormatSchema: str, options: dict[str, str] | None = None, *, partition=None, offset=None):
    """The Column of ``data`` (binary values, plain Avro binary without a
    Confluent frame) decoded under ``jsonFormatSchema`` (the writer's schema,
    JSON) into its Spark type, as ``pyspark.sql.avro.functions.from_avro``.

    ``options``: ``mode`` (``FAILFAST``, the default, or ``PERMISSIVE``),
    ``avroSchema`` (a reader schema the values are resolved to, Avro schema
    evolution) and ``datetimeRebaseMode`` (``CORRECTED`` only: values are
    read as written); another option is a :class:`ConfigError`.
    ``partition``, ``offset``: columns (or names) of the value's position,
    named by a FAILFAST error (see the module docstring); give both or none.
    """
    child, positioned = _child(data, partition, offset)
    java_options = {str(k): str(v) for k, v in (options or {}).items()}
    return _column(lambda j: j.FromAvro.plain(child, _schema_text(jsonFormatSchema), java_options, positioned))


def to_avro(data, jsonFormatSchema: str | None = None):
    """The Column of ``data`` (any supported type, a struct for a record)
    encoded as plain Avro binary under ``jsonFormatSchema``, or under the
    schema derived from the column's type when it is None, as
    ``pyspark.sql.avro.functions.to_avro`` (as there, the derived schema
    follows the column's nullability as Spark's optimizer leaves it: a
    column a filter proves non-null is written without the null union). A
    type the schema cannot hold is
    refused when the query is analysed; a value that does not fit it (a
    null where the schema has none, a string not a symbol of the enum) fails
    the job with a ``SchemaError`` naming the field."""
    schema = None if jsonFormatSchema is None else _schema_text(jsonFormatSchema)
    return _column(lambda j: j.ToAvro.column(_java_column(data), schema, -1))


def from_confluent_avro(data, subject: str, version: int | str = "latest", options: dict[str, str] | None = None, *,
                        partition=None, offset=None, client=None):
    """The Column of ``data`` (Confluent-framed Avro: magic byte 0, the
    writer's schema id as a big-endian u32, the Avro body; what
    :class:`raylog.avro.AvroSerializer` and :func:`to_confluent_avro` write)
    decoded into the Spark type of ``version`` (a number from 1 or
    ``"latest"``) of registry ``subject``: each frame's writer schema is
    looked up by its id in raylog's registry and resolved to that reader
    schema (Avro schema evolution), as typed reads of topics do.

    ``options``: ``mode`` alone (as :func:`from_avro`). ``partition``,
    ``offset``: as :func:`from_avro`. The registry is that of ``client``'s
    cluster, else of the session's (``spark.raylog.zookeeper`` and
    ``spark.raylog.cluster``, which :func:`raylog_spark.init_spark` sets), else
    of ``raylog.connect()`` or ``$RAYLOG_ZOOKEEPER``. :class:`UnknownSchemaError` when the subject has
    no such version.
    """
    extra = set(options or {}) - {"mode"}
    if extra:
        raise ConfigError(
            f"from_confluent_avro has no option {sorted(extra)[0]!r}; its one option is mode (FAILFAST or "
            "PERMISSIVE): the reader schema is the subject's version"
        )
    child, positioned = _child(data, partition, offset)
    java_options = {"avro_subject": subject, "avro_subject_version": str(version),
                    **{str(k): str(v) for k, v in (options or {}).items()}}
    settings = client.settings if client is not None else None
    if settings is None and not _session().conf.get("spark.raylog.zookeeper", None):
        settings = default_settings()  # raylog.connect()'s cluster, or $RAYLOG_ZOOKEEPER's
    if settings is not None:
        java_options.update(zookeeper=settings.zookeeper, cluster=settings.cluster)
    return _column(lambda j: j.FromAvro.confluent(child, java_options, positioned))


def to_confluent_avro(data, subject: str, jsonFormatSchema: str | None = None, *, client=None):
    """The Column of ``data`` encoded as Confluent-framed Avro (magic byte 0,
    the schema's registry id as a big-endian u32, the body, as
    :class:`raylog.avro.AvroSerializer` writes), readable by
    :func:`from_confluent_avro`, ``read_topic(value_format="avro")`` and
    any Confluent deserializer given the schema.

    The schema: ``jsonFormatSchema``, registered under ``subject`` now (its
    existing id when it is registered already; it becomes the subject's
    latest version unless it is so), or, when None, the subject's latest
    version (:class:`UnknownSchemaError` when the subject has none). The
    registry is found as by :func:`from_confluent_avro`."""
    metadata, owned = _registry_session(client)
    try:
        registry = schema_registry(metadata.zk, metadata.settings.cluster)
        if jsonFormatSchema is None:
            schema_id = registry.subject_version(subject)
            schema = registry.get_json(schema_id)
        else:
            schema = _schema_text(jsonFormatSchema)
            schema_id = registry.register(schema, subject=subject)
    finally:
        if owned is not None:
            owned.close()
    return _column(lambda j: j.ToAvro.column(_java_column(data), schema, schema_id))


# ---------------------------------------------------------------------------


def _schema_text(schema: Any) -> str:
    """A schema as JSON text (a parsed schema, a dict or list, is dumped)."""
    return schema if isinstance(schema, str) else json.dumps(schema)


def _col(c):
    from pyspark.sql import functions as F  # pyspark: imported where Spark runs

    return F.col(c) if isinstance(c, str) else c


def _java_column(c):
    from pyspark.sql.column import _to_java_column  # pyspark: imported where Spark runs

    return _to_java_column(_col(c))


def _child(data, partition, offset):
    """The Java column to decode and whether it is the struct (value, partition, offset)."""
    if partition is None and offset is None:
        return _java_column(data), False
    if partition is None or offset is None:
        raise ConfigError("pass both partition= and offset= (the value's position, named by FAILFAST errors) or none")
    from pyspark.sql import functions as F  # pyspark: imported where Spark runs

    return _java_column(F.struct(_col(data), _col(partition).cast("int"), _col(offset).cast("long"))), True


def _session():
    from pyspark.sql import SparkSession  # pyspark: imported where Spark runs

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise ConfigError("no active Spark session; start one with raylog_spark.init_spark()")
    return spark


def _column(build):
    """The pyspark Column of the Java Column ``build(package)`` makes, the
    package being ``org.raylog.spark`` in the session's JVM; raylog's errors
    thrown there raised as their raylog class."""
    from py4j.protocol import Py4JJavaError  # pyspark's bridge: imported where Spark runs
    from pyspark.sql.column import Column

    spark = _session()
    package = spark._jvm.org.raylog.spark
    try:
        return Column(build(package))
    except Py4JJavaError as err:
        raise _raylog_error(err) from None
    except TypeError as err:  # py4j: a JavaPackage is not callable when the class is not loaded
        if "JavaPackage" in str(err):
            raise ConfigError(
                "the Spark session does not load raylog's jar (org.raylog.spark); start it with "
                "raylog_spark.init_spark() with a JDK present"
            ) from None
        raise


def _raylog_error(err) -> Exception:
    """The raylog error of a Py4JJavaError caused by a RaylogReadException, else the error itself."""
    cause = err.java_exception
    while cause is not None:
        if cause.getClass().getName() == _JAVA_ERROR:
            message = str(cause.getMessage())
            _, _, rest = message.partition(": ")
            found = error_for_code(int(cause.code()), rest or message)
            return found if isinstance(found, RaylogError) else err
        cause = cause.getCause()
    return err


def _registry_session(client):
    """(the ZooKeeper session of a cluster's metadata view, that may register
    schemas; the view to close, or None): ``client``'s; else a view of the
    session's ``spark.raylog.zookeeper``, ``spark.raylog.cluster`` and
    ``spark.raylog.token``; else of ``raylog.connect()``'s cluster or
    ``$RAYLOG_ZOOKEEPER``'s (:func:`raylog.read.resolve_connection`)."""
    if client is not None:
        return client.metadata, None
    conf = _session().conf
    zookeeper = conf.get("spark.raylog.zookeeper", None)
    settings = None
    if zookeeper:
        token = conf.get("spark.raylog.token", None)
        settings = ConnectionSettings(zookeeper=zookeeper, cluster=conf.get("spark.raylog.cluster", None) or "default",
                                      token=base64.b64decode(token) if token else None)
    metadata, _, owned = resolve_connection(None, settings)
    return metadata, owned
