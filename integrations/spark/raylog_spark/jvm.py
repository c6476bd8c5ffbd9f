"""The JVM half of raylog_spark: the Spark data source ``raylog``, built on first use.

The source (a Spark DataSource V2 in Java, ``integrations/spark/java/``)
reads a read plan's byte ranges straight from the partition actors' data
sockets inside the executors' JVMs; see :mod:`raylog_spark.reader`.

It ships as Java sources, not as a jar, and :func:`jar_path` compiles them
the first time it is needed::

    javac --release 17 -cp "<pyspark>/jars/*" ...   # Spark's own jars only
    -> <cache>/raylog-spark-<digest>.jar           # classes + META-INF/services

* ``<cache>`` is ``$RAYLOG_SPARK_JAR_CACHE``, else
  ``$XDG_CACHE_HOME/raylog/spark``, else ``~/.cache/raylog/spark``.
* ``<digest>`` hashes every file under the Java source folder, the Spark
  version compiled against and the Java release, so a change to any of them
  builds a new jar; an unchanged one is found again by its name.
* A file lock (``<cache>/.build.lock``) serializes builds: concurrent first
  uses (several processes, several threads) build once, and the others find
  the finished jar. The jar is written under a temporary name and renamed
  into place, so a half-written jar is never found.
* ``javac`` comes from ``$JAVA_HOME/bin`` when that holds one, else from
  ``PATH``; without it :class:`~raylog.errors.ConfigError` says what to install.

:func:`raylog_spark.init_spark` adds the jar to the session it starts, and
:func:`loadable` tells whether a session's driver can load the source.

Thread-safety: every function may be called from any thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
import zipfile
from pathlib import Path

from raylog.errors import ConfigError

log = logging.getLogger(__name__)

#: the data source class and its short name (``spark.read.format("raylog")``)
SOURCE_CLASS = "org.raylog.spark.RaylogSource"
FORMAT = "raylog"
#: the Java release the classes target (``javac --release``)
JAVA_RELEASE = "17"
#: environment variable naming the jar cache folder
CACHE_ENV = "RAYLOG_SPARK_JAR_CACHE"
#: how long one javac run may take
JAVAC_TIMEOUT_S = 300

_MANIFEST = "Manifest-Version: 1.0\nCreated-By: raylog_spark.jvm\n"
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
        import pyspark

        home = os.path.dirname(pyspark.__file__)
    jars = Path(home) / "jars"
    if not jars.is_dir():
        raise ConfigError(f"Spark's jars are not at {jars}; set SPARK_HOME to a Spark 3.5 or reinstall pyspark")
    return jars


def cache_dir() -> Path:
    """Where built jars are kept (see the module docstring)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "raylog" / "spark"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def source_digest(root: Path | None = None) -> str:
    """A digest of the sources under ``root``, the Spark version and the Java release."""
    import pyspark

    root = java_sources() if root is None else Path(root)
    digest = hashlib.sha256()
    digest.update(f"spark {pyspark.__version__} java {JAVA_RELEASE}\n".encode())
    for path in _files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def find_javac() -> str:
    """The ``javac`` to compile with; :class:`ConfigError` when there is none."""
    from raylog.jdk import jdk_tool

    found = jdk_tool("javac")
    if found is None:
        raise ConfigError(
            "javac was not found on PATH (nor in $JAVA_HOME/bin); the raylog Spark reader is compiled on "
            "first use and needs a JDK 17 (on Debian: apt-get install openjdk-17-jdk-headless), "
            "or read with engine='python'"
        )
    return found


def jar_path(*, sources: str | os.PathLike | None = None, cache: str | os.PathLike | None = None) -> str:
    """The path of the jar of the raylog data source, built first if needed.

    ``sources`` (the Java source folder) and ``cache`` (the jar folder)
    default to :func:`java_sources` and :func:`cache_dir`. Raises
    :class:`ConfigError` when ``javac`` is missing or the build fails.
    """
    root = java_sources() if sources is None else Path(sources)
    folder = cache_dir() if cache is None else Path(cache)
    jar = folder / f"raylog-spark-{source_digest(root)}.jar"
    if jar.is_file():
        return str(jar)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the jar cache {folder}: {err}; set {CACHE_ENV} to a writable folder") from err
    with _lock, _file_lock(folder / ".build.lock"):
        if not jar.is_file():  # another process may have built it meanwhile
            _build(root, jar)
    return str(jar)


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(root: Path, jar: Path) -> None:
    javac = find_javac()
    files = _files(root)
    java = [str(p) for p in files if p.suffix == ".java"]
    if not java:
        raise ConfigError(f"no Java sources under {root}")
    log.info("building the raylog Spark reader %s from %d sources", jar.name, len(java))
    with tempfile.TemporaryDirectory(prefix=".build-", dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        command = [
            javac, "--release", JAVA_RELEASE, "-encoding", "UTF-8", "-nowarn", "-Xlint:-path",
            "-cp", str(spark_jars() / "*"), "-d", str(classes), *java,
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ConfigError(f"could not run {javac} to build the raylog Spark reader: {err}") from err
        if done.returncode != 0:
            raise ConfigError(
                f"javac failed to build the raylog Spark reader from {root} (exit {done.returncode}):\n"
                f"{(done.stderr or done.stdout).strip()[-4000:]}"
            )
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
            out.writestr("META-INF/MANIFEST.MF", _MANIFEST)
            for path in sorted(classes.rglob("*.class")):
                out.write(path, path.relative_to(classes).as_posix())
            for path in files:  # resources: the services file
                if path.suffix != ".java":
                    out.write(path, path.relative_to(root).as_posix())
        os.replace(partial, jar)


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
