"""A Spark session on the Ray cluster, through RayDP, set up for raylog.

:func:`init_spark` wraps ``raydp.init_spark`` and adds what this stack
(Spark 3.5 on JDK 17, RayDP 1.6) needs to start at all:

* JDK 17 refuses Spark's reflective access to ``java.base`` internals unless
  the modules are opened. The ``--add-opens`` flags (:data:`JDK17_JAVA_OPTIONS`)
  go to three JVMs: the driver (``spark.driver.extraJavaOptions``), the
  executors (``spark.executor.extraJavaOptions``) and RayDP's app master
  (``spark.ray.raydp_app_master.extraJavaOptions``). Options the caller gives
  under those keys are kept and placed after ours, so they win.
  Plain DataFrame work runs without them (Spark's launcher opens most
  modules for the driver itself), but moving data between Spark and Ray
  does not: RayDP's object-store writer fails in the driver unless
  ``java.math`` is opened (Spark's own list leaves it out), and the app
  master actor dies unless it gets the flags too.
* ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set to this
  interpreter, so Python workers run with the same packages as the driver
  (pass ``spark.pyspark.python`` in ``configs`` to choose another).
* The driver binds to the Ray node's address, so executor actors reach it
  even where the host name resolves elsewhere.
* Small defaults for a small machine (:data:`DEFAULT_CONFIGS`); every one
  can be overridden through ``configs``.
* The jar of raylog's JVM reader (the Spark data source ``raylog``, built
  on first use by :func:`raylog_spark.jvm.jar_path`) joins ``spark.jars``
  after the caller's own jars, so that the executors load it, and
  ``spark.driver.extraClassPath``, so that the driver does. RayDP's
  executors are plain Spark executors inside Ray actors: they fetch
  ``spark.jars`` from the driver like any executor. Without ``javac`` the
  session starts without the jar (a warning says why) and reads fall back
  to the Python reader.

Usage::

    ray.init()                     # or raylog.connect()
    spark = raylog_spark.init_spark(num_executors=1, executor_cores=1)
    ...
    raylog_spark.stop_spark()

One Spark session exists per process (a RayDP rule); stop it before
starting another.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from typing import Mapping, Sequence

from raylog import quiet
from raylog.errors import ConfigError
from raylog_spark.source import use_cluster

log = logging.getLogger(__name__)

#: Packages Spark (and Ray's Java worker, and RayDP) reach into by
#: reflection; opened to the unnamed module on JDK 17. The list is Spark's
#: own (launcher ``JavaModuleOptions``) plus ``java.math`` and ``java.text``.
_OPENED = (
    "java.base/java.lang",
    "java.base/java.lang.invoke",
    "java.base/java.lang.reflect",
    "java.base/java.io",
    "java.base/java.net",
    "java.base/java.nio",
    "java.base/java.math",
    "java.base/java.text",
    "java.base/java.util",
    "java.base/java.util.concurrent",
    "java.base/java.util.concurrent.atomic",
    "java.base/jdk.internal.ref",
    "java.base/sun.nio.ch",
    "java.base/sun.nio.cs",
    "java.base/sun.security.action",
    "java.base/sun.util.calendar",
)

#: The JVM options every Spark JVM of a raylog session gets.
JDK17_JAVA_OPTIONS: tuple[str, ...] = (
    "-XX:+IgnoreUnrecognizedVMOptions",
    *(f"--add-opens={module}=ALL-UNNAMED" for module in _OPENED),
    "-Dio.netty.tryReflectionSetAccessible=true",
)

#: The configuration keys that receive :data:`JDK17_JAVA_OPTIONS`.
JAVA_OPTIONS_KEYS = (
    "spark.driver.extraJavaOptions",
    "spark.executor.extraJavaOptions",
    "spark.ray.raydp_app_master.extraJavaOptions",
)

#: Defaults sized for a small machine; ``configs`` overrides any of them.
DEFAULT_CONFIGS: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
}


def init_spark(
    app_name: str = "raylog",
    num_executors: int = 1,
    executor_cores: int = 1,
    executor_memory: str | int = "1G",
    configs: Mapping[str, str] | None = None,
    jvm_reader: bool = True,
    verbose: bool = False,
    **kw,
):
    """Start Spark on the connected Ray cluster and return its SparkSession.

    Quiet unless ``verbose`` (or ``RAYLOG_LOG_LEVEL`` below WARNING): the
    driver's log4j logs errors only (:func:`quiet_log4j_config`, unless
    ``configs`` names a ``spark.log4j.config.file.name``), set once more
    once the session runs (Ray's Java runtime in the driver sets log4j up
    anew as it starts).

    ``configs`` are Spark settings layered over :data:`DEFAULT_CONFIGS`;
    the three ``extraJavaOptions`` keys are merged with
    :data:`JDK17_JAVA_OPTIONS` rather than replaced, and ``spark.jars`` and
    ``spark.driver.extraClassPath`` keep the caller's entries before the
    jar of raylog's JVM reader (``jvm_reader=False``: no jar, reads use the
    Python reader). Other keyword arguments
    (``enable_hive``, ``fault_tolerant_mode``, ``placement_group_strategy``,
    ...) go to ``raydp.init_spark`` unchanged.

    Raises :class:`~raylog.errors.ConfigError` when Ray is not initialized,
    when ``java`` cannot be found, when a Spark session already runs in this
    process, or for a non-positive executor count or core count.
    """
    import ray  # heavy (Ray): imported when used

    if not ray.is_initialized():
        raise ConfigError(
            "Ray is not initialized; call ray.init() or raylog.connect() before raylog_spark.init_spark()"
        )
    if num_executors < 1 or executor_cores < 1:
        raise ConfigError(
            f"num_executors and executor_cores must be at least 1, got {num_executors} and {executor_cores}"
        )
    check_java()

    import raydp  # heavy (RayDP): imported when used
    import raydp.context  # heavy (RayDP): imported when used

    if getattr(raydp.context, "_global_spark_context", None) is not None:
        raise ConfigError(
            "a Spark session already runs in this process; call raylog_spark.stop_spark() before starting another"
        )

    jars = []
    if jvm_reader:
        from raylog_spark import jvm

        try:
            jars.append(jvm.jar_path())
        except ConfigError as err:
            log.warning("Spark reads of raylog topics will use the Python reader: %s", err)
    merged = spark_configs(
        configs,
        parallelism=num_executors * executor_cores,
        driver_host=ray.util.get_node_ip_address(),
        jars=jars,
    )
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    hushed = quiet.configure(verbose)
    ours = False  # whether the driver's log4j configuration is ours (errors only)
    if hushed:
        quiet.quiet_forwarded_lines()  # the JVMs' start-up lines Ray forwards
        if "SPARK_LOG4J_CONFIG_FILE_NAME" not in os.environ:
            path = quiet_log4j_config()
            ours = merged.setdefault(LOG4J_CONFIG_KEY, path) == path
    # Spark's driver JVM starts here; quiet, its stderr goes through a filter
    # that drops the start-up line of Ray's C++ core (see raylog.quiet)
    with quiet.filter_child_stderr() if hushed else contextlib.nullcontext():
        spark = raydp.init_spark(
            app_name,
            num_executors,
            executor_cores,
            executor_memory,
            configs=merged,
            **kw,
        )
    if jars:
        from raylog_spark import jvm

        # A driver JVM started earlier in this process (by a session stopped
        # since) did not get the jar at launch: add it to this session.
        if not jvm.add_to_session(spark, jars[0]):
            log.warning("the Spark driver cannot load %s; reads will use the Python reader", jars[0])

    if ours:
        _errors_only(spark)
    use_cluster(spark)  # spark.read.format("raylog") finds this process's cluster
    return spark


def _errors_only(spark) -> None:
    """The driver JVM's log4j at errors only once more: Ray's Java runtime,
    which RayDP starts in the driver, sets log4j up anew (its own pattern,
    on stdout, warnings included), after the configuration given at launch."""
    try:
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setRootLevel(jvm.org.apache.logging.log4j.Level.ERROR)
    except Exception as err:  # (py4j: no log4j 2 core in this Spark)
        log.debug("setting the driver's log level: %s", err)


#: RayDP's setting for the driver's log4j 2 configuration file
LOG4J_CONFIG_KEY = "spark.log4j.config.file.name"

_QUIET_LOG4J = """\
# Spark's driver for raylog_spark.init_spark: errors only (verbose=True for Spark's defaults)
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
# the shell's logger at the root's level: Spark then keeps its "Setting default log level" note
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


def quiet_log4j_config() -> str:
    """The path of a log4j 2 configuration that logs errors only to stderr
    (written once per user under the temp directory). RayDP otherwise points
    the driver at ``log4j2-default.properties``, which no jar holds: log4j
    then prints "Reconfiguration failed" and Spark its warnings."""

    path = os.path.join(tempfile.gettempdir(), f"raylog-spark-log4j2-{os.getuid()}.properties")
    try:
        with open(path) as f:
            if f.read() == _QUIET_LOG4J:
                return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".raylog-log4j2-")
    with os.fdopen(fd, "w") as f:
        f.write(_QUIET_LOG4J)
    os.replace(tmp, path)  # atomic: concurrent sessions read a whole file
    return path


def stop_spark(cleanup_data: bool = True) -> None:
    """Stop the Spark session started by :func:`init_spark` (``raydp.stop_spark``).

    Safe to call when no session runs. With ``cleanup_data=False`` the Spark
    master actor is kept so that DataFrames converted to Ray datasets stay
    readable; a later call with ``True`` removes it.
    """
    import raydp  # heavy (RayDP): imported when used

    close_idle_zookeeper_sessions()
    raydp.stop_spark(cleanup_data=cleanup_data)


def close_idle_zookeeper_sessions() -> None:
    """Close the driver JVM's ZooKeeper sessions of reads by name that no
    read holds (else they outlive the session, and a ZooKeeper stopped after
    it fills the log with reconnection errors). Nothing to do without a
    running session or with the data source not loaded."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return
    try:
        spark._jvm.org.raylog.spark.RaylogSource.closeIdleZooKeeperSessions()
    except Exception as err:  # (py4j: the class is not on the classpath, the JVM is gone)
        log.debug("closing the reads' ZooKeeper sessions: %s", err)


def spark_configs(
    configs: Mapping[str, str] | None,
    *,
    parallelism: int = 1,
    driver_host: str | None = None,
    jars: Sequence[str] = (),
) -> dict[str, str]:
    """The Spark settings :func:`init_spark` passes to RayDP.

    :data:`DEFAULT_CONFIGS`, shuffle partitions at twice ``parallelism``
    (at least 2), the driver bound to ``driver_host``, then ``configs`` over
    them; the ``extraJavaOptions`` keys hold :data:`JDK17_JAVA_OPTIONS`
    followed by the caller's own options (duplicates dropped);
    ``spark.jars`` (comma-separated) and ``spark.driver.extraClassPath``
    (path-separated) hold the caller's entries, then ``jars``.
    """
    merged: dict[str, str] = dict(DEFAULT_CONFIGS)
    merged["spark.sql.shuffle.partitions"] = str(max(2, 2 * parallelism))
    if driver_host:
        merged["spark.driver.host"] = driver_host
        merged["spark.driver.bindAddress"] = driver_host
    user = {str(k): str(v) for k, v in (configs or {}).items()}
    for key in JAVA_OPTIONS_KEYS:
        merged[key] = merge_java_options(JDK17_JAVA_OPTIONS, user.pop(key, ""))
    if jars:
        merged["spark.jars"] = _append(user.pop("spark.jars", ""), jars, ",")
        key = "spark.driver.extraClassPath"
        merged[key] = _append(user.pop(key, ""), jars, os.pathsep)
    merged.update(user)
    return merged


def _append(theirs: str, ours: Sequence[str], separator: str) -> str:
    """The caller's list ``theirs`` then the entries of ``ours`` it lacks."""
    entries = [e for e in theirs.split(separator) if e.strip()]
    return separator.join(entries + [e for e in ours if e not in entries])


def merge_java_options(ours: tuple[str, ...] | list[str], theirs: str) -> str:
    """``ours`` then the caller's ``theirs`` (a space-separated string),
    with options of ``ours`` that ``theirs`` already holds left out."""
    their_tokens = theirs.split()
    kept = [opt for opt in ours if opt not in their_tokens]
    return " ".join(kept + their_tokens)


def check_java() -> str:
    """The path of the ``java`` Spark will start; :class:`ConfigError` if there is none.

    PySpark starts ``$JAVA_HOME/bin/java`` when ``JAVA_HOME`` is set, and
    RayDP starts ``java`` from ``PATH``; both must work.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if not os.access(candidate, os.X_OK):
            raise ConfigError(
                f"JAVA_HOME is {java_home!r} but {candidate} is not an executable; "
                "point JAVA_HOME at a JDK 17 or unset it"
            )
    found = shutil.which("java")
    if found is None:
        hint = f"; add {java_home}/bin to PATH" if java_home else ""
        raise ConfigError(
            "java was not found on PATH; Spark needs a JDK 17 "
            f"(on Debian: apt-get install openjdk-17-jdk-headless){hint}"
        )
    return found
