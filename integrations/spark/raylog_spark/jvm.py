"""The JVM half of raylog_spark: the jar of the Spark data source ``raylog``.

The source (a Spark DataSource V2 in Java, ``integrations/spark/java/``)
reads a read plan's byte ranges straight from the partition actors' data
sockets inside the executors' JVMs; see :mod:`raylog_spark.reader`.

The jar is built when the package is installed: ``setup.py`` compiles the
Java sources (:mod:`raylog_spark.jarbuild`) into ``raylog_spark/jars/``
when ``javac`` and Spark's jars are there, and ``make venv`` (``make
test``) runs ``python -m raylog_spark.jvm`` after installing and whenever
the Java sources change (a fresh environment has no Spark jars yet while
the package itself is built). :func:`jar_path`
finds that jar by name, ``raylog-spark-<digest>.jar`` (the digest of the
sources, the Spark version and the Java release, see
:func:`raylog_spark.jarbuild.source_digest`), and compiles nothing.

Only when the installed package has no jar for its sources (installed
without a JDK, or the Java sources edited since) :func:`jar_path` builds
one on first use, saying so in a warning, into a cache folder:

* ``$RAYLOG_SPARK_JAR_CACHE``, else ``$XDG_CACHE_HOME/raylog/spark``, else
  ``~/.cache/raylog/spark``; an unchanged jar is found again by its name.
* A file lock (``<cache>/.build.lock``) serializes builds: concurrent first
  uses (several processes, several threads) build once, and the others find
  the finished jar. The jar is written under a temporary name and renamed
  into place, so a half-written jar is never found.
* ``javac`` comes from ``$JAVA_HOME/bin`` when that holds one, else from
  ``PATH``; without it :class:`~raylog.errors.ConfigError` says what to
  install (or to read with the Python reader).

:func:`raylog_spark.init_spark` adds the jar to the session it starts, and
:func:`loadable` tells whether a session's driver can load the source.

Thread-safety: every function may be called from any thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import threading
from pathlib import Path

from raylog.errors import ConfigError
from raylog_spark import jarbuild

log = logging.getLogger(__name__)

#: the data source class and its short name (``spark.read.format("raylog")``)
SOURCE_CLASS = "org.raylog.spark.RaylogSource"
FORMAT = "raylog"
#: the Java release the classes target (``javac --release``)
JAVA_RELEASE = jarbuild.JAVA_RELEASE
#: environment variable naming the jar cache folder
CACHE_ENV = "RAYLOG_SPARK_JAR_CACHE"

_lock = threading.Lock()


def java_sources() -> Path:
    """The folder of the Java sources: ``raylog_spark/java`` when installed
    as package data, else ``integrations/spark/java`` of the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "java", here.parent / "java"):
        if (candidate / "org" / "raylog" / "spark").is_dir():
            return candidate
    raise ConfigError(
        f"the Java sources of the raylog Spark reader are missing (looked in {here / 'java'} and "
        f"{here.parent / 'java'}); reinstall raylog, or read with engine='python'"
    )


def spark_jars() -> Path:
    """The folder of the jars Spark runs with (``$SPARK_HOME/jars`` or pyspark's)."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        import pyspark  # heavy (Spark): imported when used

        home = os.path.dirname(pyspark.__file__)
    jars = Path(home) / "jars"
    if not jars.is_dir():
        raise ConfigError(f"Spark's jars are not at {jars}; set SPARK_HOME to a Spark 3.5 or reinstall pyspark")
    return jars


def cache_dir() -> Path:
    """Where jars built on first use are kept (see the module docstring)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "raylog" / "spark"


def shipped_folder() -> Path:
    """The folder of the jar built at install (inside the package)."""
    return Path(__file__).resolve().parent / jarbuild.SHIPPED_FOLDER


def source_digest(root: Path | None = None) -> str:
    """A digest of the sources under ``root``, the Spark version and the Java release."""
    try:
        return jarbuild.source_digest(java_sources() if root is None else Path(root), spark_jars())
    except RuntimeError as err:
        raise ConfigError(str(err)) from err


def find_javac() -> str:
    """The ``javac`` to compile with; :class:`ConfigError` when there is none."""
    found = jarbuild.find_javac()
    if found is None:
        raise ConfigError(
            "javac was not found on PATH (nor in $JAVA_HOME/bin), and the installed raylog has no jar of the "
            "Spark reader for these sources (it is built at install when a JDK is there); install a JDK 17 "
            "(on Debian: apt-get install openjdk-17-jdk-headless) and reinstall raylog or run "
            "`python -m raylog_spark.jvm`, or read with engine='python'"
        )
    return found


def jar_path(*, sources: str | os.PathLike | None = None, cache: str | os.PathLike | None = None) -> str:
    """The path of the jar of the raylog data source.

    With the default ``sources`` (:func:`java_sources`) and ``cache``
    (:func:`cache_dir`), the jar the package shipped from its install is
    taken when it is there. Else the jar in the cache folder, built first if
    needed (with a warning: it should have been built at install). Raises
    :class:`ConfigError` when ``javac`` is missing or the build fails.
    """
    root = java_sources() if sources is None else Path(sources)
    name = f"raylog-spark-{source_digest(root)}.jar"
    if sources is None and cache is None:
        shipped = shipped_folder() / name
        if shipped.is_file():
            return str(shipped)
    folder = cache_dir() if cache is None else Path(cache)
    jar = folder / name
    if jar.is_file():
        return str(jar)
    javac = find_javac()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the jar cache {folder}: {err}; set {CACHE_ENV} to a writable folder") from err
    with _lock, _file_lock(folder / ".build.lock"):
        if not jar.is_file():  # another process may have built it meanwhile
            log.warning(
                "the installed raylog_spark has no jar of the Spark reader for its sources (%s); building it "
                "now with %s into %s (reinstall raylog with a JDK, or run `python -m raylog_spark.jvm`, to "
                "build it at install)",
                shipped_folder() / name,
                javac,
                jar,
            )
            try:
                jarbuild.build_jar(root, spark_jars(), jar, javac)
            except RuntimeError as err:
                raise ConfigError(str(err)) from err
    return str(jar)


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def loadable(spark) -> bool:
    """Whether ``spark``'s driver loads the raylog data source (the class is
    looked up the way ``spark.read.format`` looks it up: through the calling
    thread's context class loader)."""
    try:
        jvm = spark._jvm
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName(SOURCE_CLASS, False, loader)
        return True
    except Exception:  # noqa: BLE001 - Py4JJavaError (ClassNotFoundException) or no JVM: not loadable
        return False


def add_to_session(spark, path: str) -> bool:
    """Make a running session load the jar at ``path`` when its driver does
    not yet (its JVM was started before, without the jar): added to the
    session's class loader (for this thread) and shipped to the executors.
    Returns whether the source is loadable now."""
    if loadable(spark):
        return True
    try:
        spark._jsparkSession.sessionState().resourceLoader().addJar(path)
    except Exception as err:  # noqa: BLE001 - the Python reader remains
        log.warning("could not add %s to the Spark session: %s", path, err)
        return False
    return loadable(spark)


def main(argv=None) -> int:
    """``python -m raylog_spark.jvm``: build the jar the package ships
    (``raylog_spark/jars/``) for its sources and this Spark; prints its path."""
    try:
        jar = jarbuild.build_shipped(Path(__file__).resolve().parent, java_sources(), spark_jars())
    except (RuntimeError, ConfigError) as err:
        print(f"raylog_spark: the Spark reader's jar was not built: {err}", file=sys.stderr)
        return 1
    print(jar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
