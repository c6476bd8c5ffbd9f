"""raylog_spark.jvm and raylog_spark.jarbuild: the jar of the Spark data
source ``raylog``, built at install and shipped in the package, else
compiled with javac on first use and cached by a digest of its sources. No
Spark session here (the JVM reader itself is tested in test_read.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from raylog.errors import ConfigError
from raylog_spark import jarbuild, jvm
from raylog_spark.session import spark_configs

pytestmark = pytest.mark.timeout(300)

needs_javac = pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK (javac)")


@pytest.fixture
def sources(tmp_path):
    """A copy of the Java sources, free to change."""
    copy = tmp_path / "java"
    shutil.copytree(jvm.java_sources(), copy)
    return copy


@pytest.fixture
def no_javac(tmp_path, monkeypatch):
    """A PATH without javac (and no JAVA_HOME)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)


def test_the_installed_package_ships_the_jar_of_its_sources(tmp_path, monkeypatch, no_javac, caplog):
    """Installing (setup.py's build_spark_jar, `make venv`) built the jar: the
    first use finds it without javac (none on PATH here) and builds nothing."""
    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger=jvm.__name__):
        path = jvm.jar_path()
    assert os.path.dirname(path) == str(jvm.shipped_folder())
    assert os.path.basename(path) == f"raylog-spark-{jvm.source_digest()}.jar"
    assert not (tmp_path / "cache").exists()
    assert not caplog.records
    with zipfile.ZipFile(path) as jar:
        assert "org/raylog/spark/AvroReader.class" in jar.namelist()


@needs_javac
def test_the_install_step_builds_into_the_package_and_drops_older_jars(sources, tmp_path):
    package = tmp_path / "raylog_spark"
    (package / "jars").mkdir(parents=True)
    (package / "jars" / "raylog-spark-0000000000000000.jar").write_bytes(b"old")
    assert jarbuild.find_spark_jars() == jvm.spark_jars()
    jar = jarbuild.build_shipped(package, sources, jarbuild.find_spark_jars())
    assert [p.name for p in (package / "jars").iterdir()] == [jar.name]
    assert jar.name == f"raylog-spark-{jvm.source_digest(sources)}.jar"


def test_without_javac_building_is_a_config_error(sources, tmp_path, no_javac):
    with pytest.raises(ConfigError, match="javac was not found.*engine='python'"):
        jvm.jar_path(sources=sources, cache=tmp_path / "cache")


@needs_javac
def test_a_compile_error_is_a_config_error_with_javac_s_message(sources, tmp_path):
    (sources / "org" / "raylog" / "spark" / "Broken.java").write_text("package org.raylog.spark; class Broken {")
    with pytest.raises(ConfigError, match="(?s)javac failed.*Broken.java.*reached end of file"):
        jvm.jar_path(sources=sources, cache=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.jar"))


@needs_javac
def test_the_jar_is_built_once_and_found_again_without_javac(sources, tmp_path, monkeypatch, caplog):
    cache = tmp_path / "cache"
    with caplog.at_level("WARNING", logger=jvm.__name__):
        path = jvm.jar_path(sources=sources, cache=cache)
    assert any("building it now" in r.getMessage() for r in caplog.records)  # the fallback says so
    assert os.path.dirname(path) == str(cache)
    assert os.path.basename(path) == f"raylog-spark-{jvm.source_digest(sources)}.jar"
    with zipfile.ZipFile(path) as jar:
        names = set(jar.namelist())
        services = jar.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister").decode()
    assert "org/raylog/spark/RaylogSource.class" in names
    assert "org/raylog/spark/RangeReader.class" in names
    assert services.strip() == jvm.SOURCE_CLASS
    assert not any(name.endswith(".java") for name in names)
    built = os.stat(path).st_mtime_ns
    # found again by its name: no javac needed
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert jvm.jar_path(sources=sources, cache=cache) == path
    assert os.stat(path).st_mtime_ns == built
    assert [p.name for p in cache.iterdir() if p.name.startswith(".build-")] == []


@needs_javac
def test_a_changed_source_builds_a_new_jar(sources, tmp_path):
    cache = tmp_path / "cache"
    first = jvm.jar_path(sources=sources, cache=cache)
    reader = sources / "org" / "raylog" / "spark" / "RangeReader.java"
    reader.write_text(reader.read_text() + "\n// changed\n")
    second = jvm.jar_path(sources=sources, cache=cache)
    assert second != first
    assert os.path.exists(first) and os.path.exists(second)
    # and the digest covers resources too
    services = sources / "META-INF" / "services" / "org.apache.spark.sql.sources.DataSourceRegister"
    before = jvm.source_digest(sources)
    services.write_text(services.read_text() + "\n")
    assert jvm.source_digest(sources) != before


@needs_javac
def test_concurrent_first_uses_build_one_jar(sources, tmp_path):
    cache = tmp_path / "cache"
    script = (
        "import sys; from raylog_spark import jvm; "
        "print(jvm.jar_path(sources=sys.argv[1], cache=sys.argv[2]))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(sources), str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(3)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err.decode()
            outputs.append(out.decode().strip())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(set(outputs)) == 1
    assert [p.name for p in cache.iterdir() if p.suffix == ".jar"] == [os.path.basename(outputs[0])]
    assert [p.name for p in cache.iterdir() if p.name.startswith(".build-")] == []
    with zipfile.ZipFile(outputs[0]) as jar:
        assert jar.testzip() is None


def test_cache_folder_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path / "jars"))
    assert jvm.cache_dir() == tmp_path / "jars"
    monkeypatch.delenv(jvm.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jvm.cache_dir() == tmp_path / "xdg" / "raylog" / "spark"


def test_spark_configs_append_the_jar_to_the_user_s_jars():
    conf = spark_configs(
        {"spark.jars": "/opt/a.jar,/opt/b.jar", "spark.driver.extraClassPath": "/opt/c.jar"},
        jars=["/cache/raylog-spark-x.jar"],
    )
    assert conf["spark.jars"] == "/opt/a.jar,/opt/b.jar,/cache/raylog-spark-x.jar"
    assert conf["spark.driver.extraClassPath"] == os.pathsep.join(["/opt/c.jar", "/cache/raylog-spark-x.jar"])
    alone = spark_configs(None, jars=["/cache/raylog-spark-x.jar"])
    assert alone["spark.jars"] == "/cache/raylog-spark-x.jar"
    assert "spark.jars" not in spark_configs(None)
    # a jar the user already lists is not added twice
    again = spark_configs({"spark.jars": "/cache/raylog-spark-x.jar"}, jars=["/cache/raylog-spark-x.jar"])
    assert again["spark.jars"] == "/cache/raylog-spark-x.jar"


def test_the_java_error_table_is_the_one_of_raylog_errors():
    """RaylogReadException names every wire code as raylog.errors does (one
    source of truth: this test keeps the Java table in step)."""
    import re

    from raylog import errors

    source = (jvm.java_sources() / "org" / "raylog" / "spark" / "RaylogReadException.java").read_text()
    constants = {m[0]: int(m[1]) for m in re.findall(r"static final int (\w+) = (-?\d+);", source)}
    java = {}
    for key, name in re.findall(r'NAMES\.put\((\w+|-?\d+), "(\w+)"\)', source):
        java[constants[key] if key in constants else int(key)] = name
    python = {code: cls.__name__ for code, cls in errors._BY_CODE.items()}  # noqa: SLF001
    assert java.pop(constants["DATA_LOSS"]) == "DataLossError"  # raised by readers, not on the wire
    assert java == python
