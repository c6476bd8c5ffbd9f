"""The Spark data source ``raylog`` driven from Python: the options that make
it read a plan made here (``ranges``), and the session settings that make
``spark.read.format("raylog")`` read this process's cluster by name.

The source itself is Java (``integrations/spark/java/org/raylog/spark``,
the options are described in ``ReadOptions``, ``SourceOptions`` and
``AvroSpec`` there); :mod:`raylog_spark.jvm` builds and finds its jar.
"""

from __future__ import annotations

import base64
import json

from raylog.read import FETCH_BYTES, ReadPlan
from raylog.read import default_settings
from raylog_spark.columns import spark_schema
from raylog_spark.jvm import FORMAT

#: the Spark conf keys the data source ``raylog`` reads its cluster from when
#: a read by name has no ``zookeeper``/``cluster``/``token`` option
CLUSTER_CONF = ("spark.raylog.zookeeper", "spark.raylog.cluster", "spark.raylog.token")
#: the Ray node address of this machine: where the JVM reader places a
#: partition served on a loopback address (org.raylog.spark.SourceOptions)
LOCAL_HOST_CONF = "spark.raylog.localHost"


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
            # the replicas that may serve the range (leader included): Spark prefers their hosts, the
            # reader reads from the one on its own host
            "replicas": [
                {"node": c.node, "host": c.host, "port": c.port, "location": c.node_ip if locality else None,
                 "leader": c.leader}
                for c in r.replicas
            ],
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


def jvm_dataframe(
    spark, plan: ReadPlan, *, locality: bool = True, fetch_bytes: int = FETCH_BYTES, avro=None, count_pushdown=True,
    include_headers: bool = False, include_next_offset: bool = False,
):
    """The DataFrame of ``plan`` read by the JVM reader: the columns of
    :func:`spark_schema` (binary values; ``headers`` and ``next_offset`` as
    asked), or with ``avro`` (an
    :class:`raylog_spark.avro_values.AvroColumns`) its typed columns, the
    values decoded in the executors' JVMs (``org.raylog.spark.AvroSpec``).
    A bare ``count()`` is answered by the partitions' COUNT unless
    ``count_pushdown`` is false."""

    options = jvm_options(plan, locality=locality, fetch_bytes=fetch_bytes)
    options["count_pushdown"] = "true" if count_pushdown else "false"
    options["includeHeaders"] = "true" if include_headers else "false"
    options["includeNextOffset"] = "true" if include_next_offset else "false"
    columns = spark_schema(include_headers, include_next_offset).fieldNames()
    if avro is not None:
        options.update(
            value_format="avro", avro_schema_id=str(avro.reader_id), flatten="true" if avro.flatten else "false"
        )
        columns = avro.spark_schema.fieldNames()
    return spark.read.format(FORMAT).options(**options).load().select(*columns)


def use_cluster(spark, client=None, settings=None) -> bool:
    """Make ``client``'s cluster (default: the one ``raylog.connect()`` made
    in this process, or ``RAYLOG_ZOOKEEPER``) the cluster of
    ``spark.read.format("raylog")`` and ``spark.readStream.format("raylog")``
    in this session: sets the session's ``spark.raylog.zookeeper``,
    ``spark.raylog.cluster`` and ``spark.raylog.token`` (base64), and
    ``spark.raylog.localHost`` (this Ray node's address, when Ray runs: the
    preferred location of a partition served on a loopback address, which
    the executors, registered by their node's address, then match).
    :func:`raylog_spark.init_spark` calls it. Returns False when there is no
    cluster to use (nothing is set)."""

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
    local = _ray_node_address()
    if local:
        conf.set(LOCAL_HOST_CONF, local)
    else:
        conf.unset(LOCAL_HOST_CONF)
    return True


def _ray_node_address() -> str | None:
    """This process's Ray node address, or None when Ray does not run here."""
    import ray  # heavy (Ray): imported when used

    if not ray.is_initialized():
        return None
    return ray.util.get_node_ip_address()

