"""raylog_spark.init_spark on a real local Ray with a real Spark through RayDP.

One Spark session serves the whole module (starting one takes tens of
seconds); it is stopped, and Ray shut down, when the module ends.
"""

from __future__ import annotations

import datetime
import decimal
import os
import sys

import pytest

import raylog_spark
from raylog.avro import avro_to_spark_schema
from raylog.errors import ConfigError
from raylog_spark.session import JDK17_JAVA_OPTIONS, merge_java_options, spark_configs

pytestmark = pytest.mark.timeout(300)

ADD_OPENS_LANG = "--add-opens=java.base/java.lang=ALL-UNNAMED"
ADD_OPENS_NIO_CH = "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED"


# ---------------------------------------------------------------------------
# failures first (no Spark started)


def test_init_spark_without_ray_fails():
    # In a fresh process: this one shares the session's Ray.
    import subprocess
    import sys

    code = (
        "import raylog_spark\n"
        "from raylog.errors import ConfigError\n"
        "try:\n"
        "    raylog_spark.init_spark()\n"
        "except ConfigError as err:\n"
        "    print('ConfigError:', err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "ConfigError:" in out and "ray.init() or raylog.connect()" in out


def test_init_spark_without_java_fails(ray_local, monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="java was not found on PATH"):
        raylog_spark.init_spark()


def test_init_spark_with_a_wrong_java_home_fails(ray_local, monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(ConfigError, match="JAVA_HOME"):
        raylog_spark.init_spark()


def test_init_spark_with_zero_executors_fails(ray_local):
    with pytest.raises(ConfigError, match="at least 1"):
        raylog_spark.init_spark(num_executors=0)


# the configuration handed to RayDP


def test_spark_configs_keep_user_java_options_after_ours():
    user = {
        "spark.driver.extraJavaOptions": "-Dmine=1 " + ADD_OPENS_LANG,
        "spark.sql.shuffle.partitions": "7",
        "spark.ui.enabled": "true",
    }
    conf = spark_configs(user, parallelism=1, driver_host="127.0.0.1")
    driver = conf["spark.driver.extraJavaOptions"].split()
    assert driver[-2:] == ["-Dmine=1", ADD_OPENS_LANG]
    assert driver.count(ADD_OPENS_LANG) == 1
    assert set(JDK17_JAVA_OPTIONS) <= set(driver)
    for key in ("spark.executor.extraJavaOptions", "spark.ray.raydp_app_master.extraJavaOptions"):
        assert conf[key].split() == list(JDK17_JAVA_OPTIONS)
    assert conf["spark.sql.shuffle.partitions"] == "7"
    assert conf["spark.ui.enabled"] == "true"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert user["spark.driver.extraJavaOptions"] == "-Dmine=1 " + ADD_OPENS_LANG  # not mutated


def test_spark_configs_defaults_are_small():
    conf = spark_configs(None, parallelism=1)
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert conf["spark.ui.enabled"] == "false"
    assert "spark.driver.host" not in conf


def test_merge_java_options_drops_duplicates_only():
    assert merge_java_options(("-a", "-b"), "") == "-a -b"
    assert merge_java_options(("-a", "-b"), "  -b   -c ") == "-a -b -c"


# ---------------------------------------------------------------------------
# a real session


@pytest.fixture(scope="module")
def spark(ray_local):
    raylog_spark.stop_spark()  # the folder's shared session (conftest), if it runs: started again after
    try:
        session = raylog_spark.init_spark(
            app_name="raylog-test-session",
            num_executors=1,
            executor_cores=1,
            executor_memory="512M",
            configs={"spark.executor.extraJavaOptions": "-Draylog.test=executor"},
        )
        yield session
    finally:
        raylog_spark.stop_spark()


def test_dataframe_counts(spark):
    df = spark.createDataFrame([(i, f"user-{i % 3}") for i in range(100)], "id long, user string")
    assert df.count() == 100
    by_user = {row["user"]: row["count"] for row in df.groupBy("user").count().collect()}
    assert by_user == {"user-0": 34, "user-1": 33, "user-2": 33}


def test_add_opens_reached_the_driver_jvm(spark):
    conf = spark.sparkContext.getConf()
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert ADD_OPENS_LANG in conf.get(key).split()
    # the user's executor option was kept, after ours
    assert conf.get("spark.executor.extraJavaOptions").split()[-1] == "-Draylog.test=executor"
    # and the running driver JVM was started with them
    jvm_args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert ADD_OPENS_LANG in jvm_args and ADD_OPENS_NIO_CH in jvm_args


def test_a_quiet_session_logs_errors_only_in_the_driver_jvm(spark):
    """Ray's Java runtime in the driver sets log4j up anew as RayDP starts
    it (warnings on stdout); init_spark sets errors only once more."""
    jvm = spark.sparkContext._jvm
    assert jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel().toString() == "ERROR"
    for name in ("org.apache.zookeeper.ClientCnxn", "org.apache.spark.sql.execution.streaming.ResolveWriteToStream"):
        assert not jvm.org.apache.logging.log4j.LogManager.getLogger(name).isWarnEnabled(), name


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_add_opens_reached_the_executor_jvm(spark):
    def executor_jvm_args(_):
        # In a Python worker: the command line of the nearest java ancestor,
        # the executor JVM. (Defined here so that it is pickled by value.)
        import os

        pid = os.getppid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = [a.decode() for a in f.read().split(b"\0") if a]
            if args and os.path.basename(args[0]) == "java":
                return args
            with open(f"/proc/{pid}/status") as f:
                pid = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
        return []

    args = spark.sparkContext.parallelize([0], 1).map(executor_jvm_args).collect()[0]
    assert ADD_OPENS_LANG in args and "-Draylog.test=executor" in args


def test_dataframes_cross_between_spark_and_ray(spark):
    # Spark -> Ray goes through RayDP's object-store writer, which needs
    # java.math opened in the driver and the --add-opens flags in the app master.
    import ray

    df = spark.createDataFrame([(i, i * 0.5) for i in range(20)], "id long, half double")
    ds = ray.data.from_spark(df)
    assert ds.count() == 20
    back = ds.to_spark(spark)
    assert back.count() == 20
    assert back.agg({"half": "sum"}).collect()[0][0] == sum(i * 0.5 for i in range(20))


def test_python_workers_run_this_interpreter(spark):
    executables = spark.sparkContext.parallelize(range(2), 2).map(lambda _: sys.executable).collect()
    assert set(executables) == {sys.executable}


def test_a_second_session_is_refused(spark):
    with pytest.raises(ConfigError, match="already runs"):
        raylog_spark.init_spark()


def test_avro_schema_builds_a_typed_dataframe(spark):
    avro = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "customer", "type": ["null", "string"]},
            {"name": "items", "type": {"type": "array", "items": "string"}},
            {"name": "attrs", "type": {"type": "map", "values": "int"}},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
            {
                "name": "ship_to",
                "type": ["null", {"type": "record", "name": "Place", "fields": [{"name": "city", "type": "string"}]}],
            },
            {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "due", "type": {"type": "int", "logicalType": "date"}},
            {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        ],
    }
    placed = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc)
    records = [
        {
            "id": 1,
            "customer": "ann",
            "items": ["a", "b"],
            "attrs": {"qty": 2},
            "status": "PAID",
            "ship_to": {"city": "Oslo"},
            "placed": placed,
            "due": datetime.date(2024, 5, 3),
            "total": decimal.Decimal("19.90"),
        },
        {
            "id": 2,
            "customer": None,
            "items": [],
            "attrs": {},
            "status": "NEW",
            "ship_to": None,
            "placed": placed,
            "due": datetime.date(2024, 5, 4),
            "total": decimal.Decimal("0.00"),
        },
    ]
    schema = avro_to_spark_schema(avro)
    df = spark.createDataFrame(records, schema)
    assert df.schema == schema
    rows = {row["id"]: row for row in df.collect()}
    assert rows[1]["ship_to"]["city"] == "Oslo" and rows[2]["ship_to"] is None
    assert rows[1]["attrs"] == {"qty": 2} and rows[1]["items"] == ["a", "b"]
    assert rows[1]["total"] == decimal.Decimal("19.90")
    assert rows[2]["due"] == datetime.date(2024, 5, 4)
    assert df.where("status = 'PAID'").count() == 1
    assert df.where("customer IS NULL").count() == 1
