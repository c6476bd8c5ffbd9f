"""Compiling the jar of the Spark data source ``raylog`` from its Java sources.

The standard library only: ``setup.py`` loads this file on its own (by
path, without importing raylog) to build the jar when the package is
installed, and :mod:`raylog_spark.jvm` uses it to find that jar or, as a
fallback, to build one on first use.

::

    javac --release 17 -cp "<spark jars>/*" -d <classes> <sources>/**/*.java
    -> raylog-spark-<digest>.jar        # the classes + META-INF/services (every non-.java file)

``<digest>`` (:func:`source_digest`) hashes every file under the source
folder, the Spark version compiled against (from the name of the
``spark-core`` jar in Spark's jars folder) and the Java release: a jar
whose name carries the digest of the sources and Spark at hand is the
right one, whoever built it.

Failures (no javac, no Spark jars, javac's errors) raise ``RuntimeError``
with the reason (this file cannot import raylog's errors);
:mod:`raylog_spark.jvm` turns them into raylog's ``ConfigError``.
Thread-safety: the functions keep no state; concurrent builds of one jar
must be serialized by the caller (:func:`build_jar` replaces the target
atomically, so a reader never sees half a jar).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import zipfile
from pathlib import Path

#: the Java release the classes target (``javac --release``)
JAVA_RELEASE = "17"
#: how long one javac run may take
JAVAC_TIMEOUT_S = 300
#: the folder, inside the raylog_spark package, of the jar built at install
SHIPPED_FOLDER = "jars"

_MANIFEST = "Manifest-Version: 1.0\nCreated-By: raylog_spark.jarbuild\n"
_SPARK_CORE = re.compile(r"^spark-core_[0-9.]+-(.+)\.jar$")


def find_javac() -> str | None:
    """``$JAVA_HOME/bin/javac`` when there is one, else ``javac`` on PATH, else None."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "javac")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("javac")


def find_spark_jars() -> Path | None:
    """Spark's jars folder, without importing pyspark: ``$SPARK_HOME/jars``,
    else the jars of the pyspark on ``sys.path``, else of the pyspark in the
    environment being installed into (``sysconfig``'s site-packages: a
    build that runs isolated from it still knows it); None when none holds
    a ``spark-core`` jar."""
    candidates = []
    home = os.environ.get("SPARK_HOME")
    if home:
        candidates.append(Path(home) / "jars")
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "jars" for p in spec.submodule_search_locations]
    paths = sysconfig.get_paths()
    candidates += [Path(paths[key]) / "pyspark" / "jars" for key in ("purelib", "platlib") if key in paths]
    for folder in candidates:
        if folder.is_dir() and any(folder.glob("spark-core_*.jar")):
            return folder
    return None


def spark_version(jars: Path) -> str:
    """The Spark version of a jars folder (from its ``spark-core_<scala>-<version>.jar``)."""
    for path in sorted(Path(jars).glob("spark-core_*.jar")):
        found = _SPARK_CORE.match(path.name)
        if found:
            return found.group(1)
    raise RuntimeError(f"{jars} holds no spark-core jar; it is not the jars folder of a Spark")


def files(root: Path) -> list[Path]:
    """Every file under ``root`` but hidden ones, sorted."""
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and not p.name.startswith("."))


def source_digest(root: Path, jars: Path) -> str:
    """A digest of the sources under ``root``, the Spark version of ``jars`` and the Java release."""
    root = Path(root)
    digest = hashlib.sha256()
    digest.update(f"spark {spark_version(jars)} java {JAVA_RELEASE}\n".encode())
    for path in files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def jar_name(root: Path, jars: Path) -> str:
    """The file name of the jar of the sources under ``root`` compiled against ``jars``."""
    return f"raylog-spark-{source_digest(root, jars)}.jar"


def build_jar(root: Path, jars: Path, jar: Path, javac: str | None = None) -> Path:
    """Compile the sources under ``root`` against Spark's ``jars`` into ``jar``
    (written under a temporary name in its folder, then renamed into place)."""
    root, jar = Path(root), Path(jar)
    javac = javac or find_javac()
    if javac is None:
        raise RuntimeError("javac was not found on PATH (nor in $JAVA_HOME/bin)")
    all_files = files(root)
    java = [str(p) for p in all_files if p.suffix == ".java"]
    if not java:
        raise RuntimeError(f"no Java sources under {root}")
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        command = [
            javac, "--release", JAVA_RELEASE, "-encoding", "UTF-8", "-nowarn", "-Xlint:-path",
            "-cp", str(Path(jars) / "*"), "-d", str(classes), *java,
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise RuntimeError(f"could not run {javac}: {err}") from err
        if done.returncode != 0:
            raise RuntimeError(
                f"javac failed to build the raylog Spark reader from {root} (exit {done.returncode}):\n"
                f"{(done.stderr or done.stdout).strip()[-4000:]}"
            )
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
            out.writestr("META-INF/MANIFEST.MF", _MANIFEST)
            for path in sorted(classes.rglob("*.class")):
                out.write(path, path.relative_to(classes).as_posix())
            for path in all_files:  # resources: the services file
                if path.suffix != ".java":
                    out.write(path, path.relative_to(root).as_posix())
        os.replace(partial, jar)
    return jar


def build_shipped(package: Path, root: Path, jars: Path) -> Path:
    """Build the jar into ``package``/jars (the folder the installed package
    ships), removing jars of older sources there; returns its path."""
    folder = Path(package) / SHIPPED_FOLDER
    jar = folder / jar_name(root, jars)
    if not jar.is_file():
        build_jar(root, jars, jar)
    for old in folder.glob("raylog-spark-*.jar"):
        if old != jar:
            old.unlink()
    return jar
