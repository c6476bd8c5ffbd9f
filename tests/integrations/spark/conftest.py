"""The Spark integration tests share the session's local Ray (``ray_local``
in the root conftest) and one Spark session per worker: starting one takes
tens of seconds, and the root conftest's scheduler sends this folder's
modules to one worker together, one after the other. Each module's
``spark`` is that session pointed at the module's cluster
(``raylog_spark.use_cluster``) when the module has one. A module that needs
a session of its own (test_session.py) stops the shared one first; the next
module starts it again. It is stopped when the worker ends."""

from __future__ import annotations

import pytest

SHARED_OPTIONS = dict(
    app_name="raylog-spark-tests",
    num_executors=1,
    executor_cores=1,
    executor_memory="512M",
    configs={"spark.task.maxFailures": "1"},
)


def _running(session) -> bool:
    from pyspark import SparkContext

    return session is not None and SparkContext._active_spark_context is session.sparkContext


@pytest.fixture(scope="session")
def _shared_spark(ray_local):
    """The worker's shared session (started by the first module that asks);
    failing tasks fail the job at once."""
    import raylog_spark

    holder = {"session": None}
    try:
        yield holder
    finally:
        if _running(holder["session"]):
            raylog_spark.stop_spark()


@pytest.fixture(scope="module")
def spark(_shared_spark, request):
    """The shared Spark session, started again if a module stopped it, and
    pointed at the module's cluster when the module uses ``raylog_client``."""
    import raylog_spark

    if not _running(_shared_spark["session"]):
        _shared_spark["session"] = raylog_spark.init_spark(**SHARED_OPTIONS)
    session = _shared_spark["session"]
    if any("raylog_client" in item.fixturenames for item in request.session.items
           if getattr(item, "module", None) is request.module):
        assert raylog_spark.use_cluster(session, request.getfixturevalue("raylog_client"))
    return session
