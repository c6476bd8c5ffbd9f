"""The Spark integration tests share the session's local Ray (``ray_local``
in the root conftest) and one Spark session while they run one after the
other: starting one takes tens of seconds, and the root conftest's
scheduler sends this folder's modules that use ``spark`` (and do not define
their own) to one worker together. Each module's ``spark`` is that session
pointed at the module's cluster (``raylog_spark.use_cluster``) when the
module has one. The session is stopped after the last test of such a
module when the next test's module is not one (its executor holds a CPU of the local
Ray that other modules count on), and a module that needs a session of its
own (test_session.py) stops it first; the next module starts it again."""

from __future__ import annotations

import pytest

SHARED_OPTIONS = dict(
    app_name="raylog-spark-tests",
    num_executors=1,
    executor_cores=1,
    executor_memory="512M",
    configs={"spark.task.maxFailures": "1"},
)

#: the shared session, while it runs
_SHARED: dict = {"session": None}


def _running(session) -> bool:
    from pyspark import SparkContext

    return session is not None and SparkContext._active_spark_context is session.sparkContext


def _stop_shared() -> None:
    import raylog_spark

    if _running(_SHARED["session"]):
        raylog_spark.stop_spark()
    _SHARED["session"] = None


def _takes_shared(item) -> bool:
    """Whether ``item`` takes the shared session (its module defines no ``spark`` of its own)."""
    if "spark" not in getattr(item, "fixturenames", ()):
        return False
    definitions = item._fixtureinfo.name2fixturedefs.get("spark", ())
    return bool(definitions) and definitions[-1].func.__module__ == __name__


def _sharing_module(item, cache: dict = {}) -> bool:  # noqa: B006 - the run's modules, found once
    """Whether ``item``'s module has a test that takes the shared session."""
    if item is None:
        return False
    session = item.session
    if cache.get("session") is not session:
        cache["session"] = session
        cache["modules"] = {it.module for it in session.items if _takes_shared(it)}
    return getattr(item, "module", None) in cache["modules"]


@pytest.fixture(scope="module")
def spark(ray_local, request):
    """The shared Spark session (failing tasks fail the job at once),
    started again if a module stopped it, and pointed at the module's
    cluster when the module uses ``raylog_client``."""
    import raylog_spark

    if not _running(_SHARED["session"]):
        _SHARED["session"] = raylog_spark.init_spark(**SHARED_OPTIONS)
    session = _SHARED["session"]
    if any("raylog_client" in item.fixturenames for item in request.session.items
           if getattr(item, "module", None) is request.module):
        assert raylog_spark.use_cluster(session, request.getfixturevalue("raylog_client"))
    return session


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    # before the fixtures' teardown (Ray still runs); the module's fixture
    # keeps its session, so only between modules
    if _sharing_module(item) and not _sharing_module(nextitem):
        _stop_shared()
