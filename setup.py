"""Build steps beyond pyproject.toml: the compiled fast path of the message
format, and the jar of the Spark data source ``raylog``.

``raylog.storage._speedups``, ``raylog.storage._compaction`` and
``raylog.producer._fastsend`` are optional: if they do not build (no
compiler, no Python headers), the install goes on and raylog runs the
pure-Python message code, log cleaner and ``Producer.send``, which are the
reference anyway.

The jar (``raylog_spark/jars/raylog-spark-<digest>.jar``) is compiled from
``integrations/spark/java`` by ``build_spark_jar`` (part of ``build``, and of
editable installs, which put it in the source tree) when ``javac`` and
Spark's jars are found (see ``raylog_spark/jarbuild.py``). Without them the
install goes on and says so: ``python -m raylog_spark.jvm`` builds it later
(``make venv`` does, once pyspark is installed), else raylog_spark builds it
with javac on first use.
"""

import importlib.util
from pathlib import Path

from setuptools import Command, Extension, find_packages, setup
from setuptools.command.build import build

HERE = Path(__file__).resolve().parent
JAVA_SOURCES = HERE / "integrations" / "spark" / "java"
SPARK_PACKAGE = HERE / "integrations" / "spark" / "raylog_spark"


def _jarbuild():
    """raylog_spark/jarbuild.py, loaded by path (raylog itself cannot be imported while it is being built)."""
    spec = importlib.util.spec_from_file_location("_raylog_jarbuild", SPARK_PACKAGE / "jarbuild.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class build_spark_jar(Command):
    """Compile the Spark data source into raylog_spark/jars (skipped, with a note, without javac or Spark's jars)."""

    description = __doc__
    user_options = []

    def initialize_options(self):
        self.build_lib = None
        self.editable_mode = False

    def finalize_options(self):
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def run(self):
        jarbuild = _jarbuild()
        package = SPARK_PACKAGE if self.editable_mode else Path(self.build_lib) / "raylog_spark"
        jars = jarbuild.find_spark_jars()
        why = None
        if jars is None:
            why = "Spark's jars were not found (no $SPARK_HOME, no pyspark installed yet)"
        elif jarbuild.find_javac() is None:
            why = "javac was not found (no JDK)"
        if why is not None:
            print(
                f"raylog_spark: the Spark reader's jar is not built now: {why}; run `python -m raylog_spark.jvm` "
                f"once pyspark and a JDK are installed, else it is built with javac on first use"
            )
            return
        try:
            jar = jarbuild.build_shipped(package, JAVA_SOURCES, jars)
        except RuntimeError as err:
            print(f"raylog_spark: the Spark reader's jar is not built now: {err}")
            return
        print(f"raylog_spark: built {jar}")


class build_with_jar(build):
    sub_commands = build.sub_commands + [("build_spark_jar", None)]


def _packages():
    """Every package of raylog and raylog_spark, found on disk (a hand-written list once left
    ``raylog.replication`` out of the wheel), plus the Java sources shipped as package data."""
    found = find_packages(where=str(HERE), include=["raylog", "raylog.*"])
    found += find_packages(where=str(HERE / "integrations" / "spark"), include=["raylog_spark", "raylog_spark.*"])
    return found + ["raylog_spark.java"]


setup(
    packages=_packages(),
    cmdclass={"build": build_with_jar, "build_spark_jar": build_spark_jar},
    ext_modules=[
        Extension(
            "raylog.storage._speedups",
            sources=["raylog/storage/_speedups.c"],
            optional=True,
        ),
        Extension(
            "raylog.storage._compaction",
            sources=["raylog/storage/_compaction.c"],
            optional=True,
        ),
        Extension(
            "raylog.kafka._kafkarecords",
            sources=["raylog/kafka/_kafkarecords.c"],
            optional=True,
        ),
        Extension(
            "raylog.producer._fastsend",
            sources=["raylog/producer/_fastsend.c", "raylog/producer/_groupfill.c"],
            depends=["raylog/producer/_slots.h"],
            optional=True,
        ),
    ],
)
