"""Fixtures shared by every test suite.

* ``zookeeper`` (session): one embedded ZooKeeper for the whole run.
* ``zk`` (function): a connected :class:`kazoo.client.KazooClient` on it.
* ``make_zk`` (function): a factory for more clients (several consumers,
  a second session ...); all of them are closed after the test.
* ``cluster_name`` (function): a fresh cluster name, so that tests never see
  each other's znodes under ``/raylog/<cluster>``.
* ``registry`` (function): a :class:`raylog.zk.registry.Registry` on
  ``zk`` and ``cluster_name``.
* ``private_zookeeper`` (function): a ZooKeeper of the test's own, for tests
  that stop, restart or otherwise hurt the server.

* ``ray_local`` (session): one local Ray for the whole run, whose node
  offers local disk (``raylog_disk``) under the identity ``local``.
* ``raylog_client`` (module): a :class:`raylog.Client` on both, with a
  cluster name and data directory of its own.
* ``source`` (module): a second such client, of another cluster on the same
  ZooKeeper and Ray (the source of the mirror tests).
* ``make_topic`` (function): creates a fresh topic and returns its name.

* ``hosts_cluster`` (session): one :class:`raylog.testing.hosts.HostsCluster`
  for the whole run (4 hosts: the head, disk hosts ``h2``-``h4``), started
  when a test first asks for it; without root (or ``ip``/``nft``) the test
  skips with the reason.
* ``hosts`` (module): the same, with this process joined to its Ray as the
  driver for the module (the local Ray of ``ray_local``, if it runs, is
  stopped meanwhile and started again after); network faults are healed
  after each module. Mark such tests ``@pytest.mark.hosts``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid

import pytest

from raylog.zk.server import EmbeddedZooKeeper
from raylog.zk.session import connect_kazoo

#: session timeout of test clients, in seconds
ZK_SESSION_TIMEOUT_S = 10.0


def _close(client) -> None:
    try:
        client.stop()
    finally:
        client.close()


@pytest.fixture(scope="session")
def zookeeper():
    # a scratch server (no owner: the unit tests write through sessions
    # without a token); "cons" for the tests that watch sessions come and go
    server = EmbeddedZooKeeper(four_letter_words="ruok,srvr,cons")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_zk(zookeeper):
    clients = []

    def make(hosts: str | None = None, **kw):
        if not zookeeper.running and hosts is None:
            zookeeper.start()  # a test stopped the shared server; bring it back
        kw.setdefault("timeout", ZK_SESSION_TIMEOUT_S)
        client = connect_kazoo(hosts or zookeeper.connect_string, **kw)
        clients.append(client)
        return client

    try:
        yield make
    finally:
        for client in reversed(clients):
            _close(client)


@pytest.fixture
def zk(make_zk):
    return make_zk()


@pytest.fixture
def cluster_name() -> str:
    return f"test-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def registry(zk, cluster_name):
    from raylog.zk.registry import Registry

    return Registry(zk, cluster_name)


@pytest.fixture
def private_zookeeper(tmp_path):
    server = EmbeddedZooKeeper(data_dir=str(tmp_path / "zookeeper"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


# -- Ray -----------------------------------------------------------------------
# One local Ray for the whole run (ray.init works once per process); every
# suite that needs Ray (partition actors, consumers, Spark) shares it.


@pytest.fixture(scope="session")
def ray_local():
    import ray

    if ray.is_initialized():
        yield ray
        return
    _init_local_ray()
    try:
        yield ray
    finally:
        ray.shutdown()


def _init_local_ray() -> None:
    import ray

    from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL

    ray.init(
        address="local",  # never a cluster that happens to run on the machine
        num_cpus=4,
        resources={DISK_RESOURCE: 1},
        labels={NODE_LABEL: "local"},
        include_dashboard=False,
        logging_level="WARNING",
        object_store_memory=512 * 1024 * 1024,
    )


@contextlib.contextmanager
def _own_cluster(zookeeper, prefix: str, data_dir: str):
    """A :class:`raylog.Client` of a cluster of its own (a fresh name, the
    data directory ``data_dir``) on ``zookeeper``; its topics are deleted
    and the client closed at the end."""
    from raylog.client import Client

    client = Client(zookeeper=zookeeper.connect_string, cluster=f"{prefix}-{uuid.uuid4().hex[:16]}",
                    data_dir=data_dir, data_host="127.0.0.1")
    try:
        yield client
    finally:
        try:
            for topic in client.list_topics():
                client.delete_topic(topic)
        finally:
            client.close()


@pytest.fixture(scope="module")
def raylog_client(zookeeper, ray_local, tmp_path_factory):
    """A :class:`raylog.Client` on the shared ZooKeeper and Ray, with a
    cluster name and data directory of its own; its topics are deleted after
    the module."""
    if not zookeeper.running:
        zookeeper.start()
    with _own_cluster(zookeeper, "test", str(tmp_path_factory.mktemp("raylog-data"))) as client:
        yield client


@pytest.fixture(scope="module")
def source(zookeeper, ray_local, tmp_path_factory):
    """A second cluster beside the module's ``raylog_client`` (another name
    and data directory on the same ZooKeeper and Ray): the source of the
    mirror tests."""
    with _own_cluster(zookeeper, "src", str(tmp_path_factory.mktemp("raylog-source"))) as client:
        yield client


@pytest.fixture
def make_topic(raylog_client):
    """``make_topic(partitions=1, **settings) -> name``: a fresh topic."""

    def make(partitions: int = 1, **settings) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        raylog_client.create_topic(name, partitions=partitions, **settings)
        return name

    return make


# -- consumer groups: the one-owner invariant, watched while faults happen ------


class OwnerWatcher:
    """Checks continuously, on a thread of its own, that no partition has two
    owners: no two members hand out the same partition at the same instant,
    and no member hands out a partition whose owner node holds another id.

    Each round samples every member's ``assignment`` twice with the owner
    nodes read in between; a partition counts as held by a member only if
    both samples show it, so a clean hand-over between the samples is not
    reported. ``members()`` returns the live GroupMember objects.
    """

    def __init__(self, zk, cluster: str, group: str, topics, members, interval_s: float = 0.01):
        from raylog.zk.paths import Paths

        self.zk, self.paths, self.group, self.topics = zk, Paths(cluster), group, list(topics)
        self.members = members
        self.interval_s = interval_s
        self.violations: list[str] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="owner-watcher", daemon=True)

    def _owner_nodes(self) -> dict:
        from kazoo.exceptions import NoNodeError

        nodes = {}
        for topic in self.topics:
            try:
                names = self.zk.get_children(self.paths.owners(self.group, topic))
            except NoNodeError:
                continue
            for name in names:
                try:
                    nodes[(topic, int(name))] = self.zk.get(self.paths.owner(self.group, topic, int(name)))[0].decode()
                except NoNodeError:
                    pass
        return nodes

    def check_once(self) -> None:
        members = list(self.members())
        first = [m.assignment for m in members]
        nodes = self._owner_nodes()
        second = [m.assignment for m in members]
        held = [a & b for a, b in zip(first, second)]
        for i, m in enumerate(members):
            for tp in held[i]:
                for j in range(i + 1, len(members)):
                    if tp in held[j]:
                        self.violations.append(f"{tp} handed out by {m.consumer_id} and {members[j].consumer_id}")
                holder = nodes.get(tp)
                if holder is not None and holder != m.consumer_id and tp in m.assignment:
                    self.violations.append(f"{tp} handed out by {m.consumer_id} but its node holds {holder}")
        self.rounds += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check_once()
            except Exception:  # noqa: BLE001 - ZooKeeper down in the test: try again
                pass
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        if exc[0] is None:
            assert self.rounds > 0, "the owner watcher never completed a round"
            assert not self.violations, self.violations[:10]


@pytest.fixture
def owner_watcher(make_zk):
    """``owner_watcher(cluster, group, topics, members_fn)``: a context manager
    that fails the test if two members owned one partition at once."""

    def make(cluster, group, topics, members, interval_s: float = 0.01):
        return OwnerWatcher(make_zk(), cluster, group, topics, members, interval_s)

    return make


# -- hosts: real network boundaries (raylog.testing.hosts) -----------------------


def pytest_configure(config):
    config.addinivalue_line("markers", "hosts: runs on the hosts kit (network namespaces; needs root)")
    # Ray's token before any cluster starts (the first ray.init() would make it halfway through)
    from raylog.testing.ray_token import ensure_ray_token

    ensure_ray_token()


# -- several workers (``pytest -n N --dist loadgroup``, as ``make test`` runs) ----
#
# A unit of work goes to one worker whole: a module's tests (they share its
# module fixtures: a client, a Spark session ...), and every module of the
# hosts kit together (they share one HostsCluster, the session fixture), and
# every Spark module that uses the shared Spark session (the ``spark``
# fixture of tests/integrations/spark/conftest.py) together. The
# scheduler is ours because it decides by module: pytest-xdist's own
# ``xdist_group`` marks rename node ids, which pytest 9 no longer allows.


def _shared_unit(path: str) -> str | None:
    """The unit of work the test module at ``path`` (relative to the root)
    shares with others, read from its source (the scheduler runs where
    nothing is collected): "hosts-kit" for a module marked ``hosts``,
    "spark-session" for a module of the Spark folder whose tests or fixtures
    take ``spark`` without defining a ``spark`` fixture of its own; else None."""
    import ast

    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return None
    nodes = list(ast.walk(tree))
    if any(isinstance(node, ast.Attribute) and node.attr == "hosts" and isinstance(node.value, ast.Attribute)
           and node.value.attr == "mark" for node in nodes):
        return "hosts-kit"
    functions = [node for node in nodes if isinstance(node, ast.FunctionDef)]
    if (path.replace("\\", "/").rsplit("/tests/", 1)[-1].startswith("integrations/spark/")
            and any(arg.arg == "spark" for f in functions for arg in f.args.args)
            and not any(f.name == "spark" for f in functions)):
        return "spark-session"
    return None


def _unit(nodeid: str, root: str, cache: dict) -> str:
    import os

    module = nodeid.split("::", 1)[0]
    if module not in cache:
        cache[module] = _shared_unit(os.path.join(root, module))
    return cache[module] or module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root, cache = str(config.rootpath), {}

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid, root, cache)

    return ByModule(config, log)


def _uses_shared_kit(item) -> bool:
    return "hosts_cluster" in item.fixturenames


def pytest_collection_modifyitems(config, items):
    # the tests marked hosts first: on a worker of several, the hosts kit's long unit first, so that it
    # ends in time; in it (and in a run of one process), the tests that start kits of their own (or need
    # none) before the shared kit starts, so that its idle Ray nodes do not slow their start-ups (a node
    # that misses Ray's 30 s registration starts again); and the shared kit stops after them (below)
    items.sort(key=lambda item: (item.get_closest_marker("hosts") is None, _uses_shared_kit(item)))


#: the shared kit while it runs (the ``hosts_cluster`` fixture's), for its early stop
_shared_kit: list = []


@pytest.fixture(scope="session")
def hosts_cluster():
    from raylog.testing.hosts import HostsCluster, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(why)
    with HostsCluster(hosts=4) as cluster:
        _shared_kit.append(cluster)
        try:
            yield cluster
        finally:
            _shared_kit.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """The shared kit stops after the last test marked ``hosts`` (the items
    are sorted as above: those first; on a worker of several, the scheduler
    hands the whole hosts kit's unit to one worker, in that order) rather
    than at the end of the session: its Ray nodes and ZooKeeper would
    otherwise idle on the machine's cores under the rest of the run. (Its
    session teardown then finds it stopped: ``stop`` runs once more, doing
    nothing.)"""
    result = yield
    if _shared_kit and nextitem is not None and nextitem.get_closest_marker("hosts") is None:
        _shared_kit.pop().stop()
    return result


@pytest.fixture(scope="module")
def hosts(hosts_cluster):
    import ray

    from raylog.testing import faults

    had_local = ray.is_initialized() and not hosts_cluster._ray_connected
    if had_local:
        ray.shutdown()
    hosts_cluster.connect_ray()
    try:
        yield hosts_cluster
    finally:
        faults.heal(hosts_cluster)
        hosts_cluster.release_clients()  # the module's clusters stop: nothing idle for the next modules
        hosts_cluster.disconnect_ray()
        if had_local:
            _init_local_ray()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def _keep_host_logs_of_a_failure(request, tmp_path_factory):
    """A test on the hosts kit that fails keeps each host's Ray logs (the
    kit removes them when it stops) under its tmp dir, named in its report."""
    yield
    report = getattr(request.node, "report_call", None)
    if report is None or not report.failed or "hosts_cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("hosts_cluster")
    dest = str(tmp_path_factory.mktemp("host-logs"))
    try:
        kept = cluster.keep_logs(dest)
    except Exception as err:  # noqa: BLE001 - the failure itself is what matters
        kept, dest = [], f"not kept: {err}"
    report.sections.append(("host logs", f"{len(kept)} files in {dest}"))
