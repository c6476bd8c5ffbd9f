"""The hosts kit's example of docs/howto/hosts.md ("Across hosts"), on the
run's shared kit (the ``hosts`` fixture, tests/conftest.py): its imports,
then its one statement, ``with HostsCluster(hosts=3) as hosts:``, whose
body runs against the shared kit (which has those hosts and one more), so
that the example costs no kit of its own. What its ``with`` does on entry
and on leaving (start, and remove everything, even after a killed run) is
tests/testing/test_hosts.py's.

A module of its own: the other tests of the documentation site
(tests/test_docs_site.py) need no kit and run beside it.
"""

from __future__ import annotations

import ast

import pytest

from raylog.testing.clusters import wait_until
from raylog.testing.host_checks import NODE_DEATH_WAIT_S
from tests.doc_blocks import block

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]


def _alive_nodes_at(address: str) -> int:
    import ray

    return sum(1 for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == address)


def test_the_hosts_kit_example_runs_as_written(hosts):
    from raylog.testing import faults
    from raylog.testing.hosts import HostsCluster

    code = block("docs/howto/hosts.md", "Across hosts")
    tree = ast.parse(code)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    (statement,) = [node for node in tree.body if node not in imports]
    assert isinstance(statement, ast.With) and len(statement.items) == 1, ast.unparse(statement)
    (item,) = statement.items
    assert ast.unparse(item.context_expr) == "HostsCluster(hosts=3)" and ast.unparse(item.optional_vars) == "hosts"
    assert hosts.names[:3] == ["h1", "h2", "h3"] and {"h2", "h3"} <= hosts.disk_names  # what the example has

    namespace: dict = {}
    exec(compile(ast.Module(body=imports, type_ignores=[]), "hosts.md", "exec"), namespace)
    assert namespace["HostsCluster"] is HostsCluster and namespace["faults"] is faults
    namespace["hosts"] = hosts
    h3 = hosts.host("h3")
    try:
        exec(compile(ast.Module(body=statement.body, type_ignores=[]), "hosts.md", "exec"), namespace)
        assert h3.ray is not None and h3.ray.poll() is None  # h3's Ray node started again, running
    finally:
        faults.heal(hosts)
        # The example starts h3's node again at once; Ray counts the killed one dead after its
        # health checks. The next tests find one node a host.
        assert wait_until(lambda: _alive_nodes_at(h3.address) == 1, timeout_s=NODE_DEATH_WAIT_S), \
            "h3's killed Ray node is still counted alive beside the new one"
