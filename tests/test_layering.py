"""The layering of docs/design.md section 1, checked over every import.

Every ``import`` and ``from ... import`` in ``raylog/`` and in
``integrations/spark/raylog_spark`` is read with :mod:`ast` -- module-level
ones and the ones inside functions, methods and ``if`` blocks alike -- and
held against the table of docs/design.md section 1 (``TABLE`` below, the third
column as data). A second check walks the import graph of ``raylog/`` at
module granularity (lazy imports included) and fails on any cycle.

How the table is read:

* a folder may import its own modules, the folders its row names, and what
  those may import in turn (so ``groups`` -> ``zk`` -> ``storage``);
* ``BASE`` is the bottom of the house: top-level modules that import nothing
  of raylog's but each other (checked below). The table names ``config`` and
  ``errors``; the other modules of ``BASE`` are of the same kind (a retry
  policy, the token, metrics, the JDK finder, audit counts, log setup,
  Ray address resolution) and every folder may import them;
* the public API is the package itself, its top-level modules whose names
  do not start with ``_``, and the package ``raylog.read`` (the read plans,
  whose ``__init__`` holds everything public of it), and the Spark
  integration's package ``raylog_spark`` (its ``__init__``: what users
  import; the demo reads with it). ``raylog/tools/``,
  ``raylog/testing/`` and ``raylog_spark`` may import only these.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

from tests.source_trees import parse

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "raylog", ROOT / "integrations" / "spark" / "raylog_spark")

#: docs/design.md section 1, third column: folder -> the folders it may import.
TABLE: dict[str, set[str]] = {
    "storage": {"config", "errors"},
    "transfer": {"storage", "config", "errors"},
    "zk": {"storage", "config", "errors"},
    "groups": {"zk"},
    "replication": {"storage", "transfer", "zk"},
    # "all of the above"; and the producer: actors/ owns the producer actor
    # (its "owns" column), which wraps raylog.producer (proposed for the table)
    "actors": {"storage", "transfer", "zk", "groups", "replication", "metadata", "producer"},
    "producer": {"transfer", "zk", "groups", "metadata"},
    # the Kafka front door (docs/design.md section 10): what actors/ may
    # import but actors/ itself (proposed for the table)
    "kafka": {"storage", "transfer", "zk", "groups", "replication", "metadata"},
    "consumer": {"transfer", "zk", "groups", "metadata"},
    "read": {"transfer", "zk", "metadata"},
    "top": {"storage", "transfer", "zk", "groups", "replication", "actors", "producer", "consumer", "read",
            "metadata", "kafka"},
    "tools": {"public"},
    "testing": {"public"},
    "spark": {"public"},
    # raylog/metadata.py, the clients' view of the cluster (ZooKeeper and the
    # partitions' endpoints), sits at the level of the clients that use it:
    # the table does not name it yet (proposed: a row of its own, as here)
    "metadata": {"transfer", "zk"},
}

#: Top-level modules below every folder (see the module docstring).
BASE = {"config", "errors", "retry", "auth", "metrics", "jdk", "audit", "quiet", "ray_join"}

#: Imports against the table that are known and not fixed yet: (importer,
#: imported module) -> why. Each is reported; the test fails on any import
#: against the table that is not listed here, and on an entry here that the
#: code no longer needs (so the list only shrinks).
PENDING: dict[tuple[str, str], str] = {}

FOLDERS = {"storage", "transfer", "zk", "groups", "replication", "actors", "producer", "consumer", "read", "tools", "testing",
           "kafka"}


def _module_files() -> dict[str, Path]:
    modules = {}
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            parts = list(path.relative_to(source.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
        # compiled extensions (``_speedups``, ``_fastsend``): leaves of the graph
        for path in sorted(source.rglob("*.c")):
            modules[".".join(path.relative_to(source.parent).with_suffix("").parts)] = path
    return modules


MODULES = _module_files()


@functools.lru_cache(maxsize=None)
def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """Every raylog module ``module`` imports (lazy ones too), with line numbers."""
    if path.suffix != ".py":
        return []
    return _imports_in(module, path.name == "__init__.py", path.read_text(), str(path))


def _imports_in(module: str, is_package: bool, source: str, filename: str = "<source>") -> list[tuple[str, int]]:
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(parse(source, filename)):
        if isinstance(node, ast.Import):
            targets = [_resolve(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                depth = len(package.split(".")) - node.level + 1
                base = ".".join(package.split(".")[:depth])
                stem = f"{base}.{node.module}" if node.module else base
            else:
                stem = node.module
            # ``from raylog.storage import message`` imports the module
            # raylog.storage.message; ``from raylog.errors import X`` imports
            # raylog.errors.
            targets = []
            for alias in node.names:
                target = _resolve(f"{stem}.{alias.name}")
                targets.append(target if target == f"{stem}.{alias.name}" else _resolve(stem))
        else:
            continue
        found.extend((target, node.lineno) for target in targets if target is not None)
    return found


def _resolve(name: str) -> str | None:
    """The longest known module that ``name`` names (or lies in), or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _part(module: str) -> str:
    """The row of the table (or the base module) that ``module`` belongs to."""
    parts = module.split(".")
    if parts[0] == "raylog_spark":
        return "spark"
    if len(parts) == 1:
        return "package"
    if parts[1] in FOLDERS:
        return parts[1]
    if parts[1] in BASE:
        return parts[1]
    if parts[1] == "metadata":
        return "metadata"
    return "top"


def _allowed(part: str) -> set[str]:
    """The closure of the table for one row: what ``part`` may import."""
    if part in BASE:
        return set(BASE)
    if TABLE.get(part) == {"public"}:
        return {part, "public"}  # only the public API: not the base's private modules
    if part == "package":
        part = "top"
    seen, todo = set(), [part]
    while todo:
        row = todo.pop()
        for target in TABLE.get(row, ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen | {part} | BASE


def _is_public(module: str) -> bool:
    parts = module.split(".")
    if parts == ["raylog", "read"]:
        return True  # the read plans: "everything public is importable from raylog.read" (its docstring)
    if parts == ["raylog_spark"]:
        return True  # the Spark integration's public package: what users import (the demo reads with it)
    return parts == ["raylog"] or (len(parts) == 2 and parts[1] not in FOLDERS and not parts[1].startswith("_"))


def violations() -> dict[tuple[str, str], str]:
    """``{(importer, imported): "path:line: ..."}`` for every import against the table."""
    found = {}
    for module, path in MODULES.items():
        part = _part(module)
        allowed = _allowed(part)
        for target, line in _imports(module, path):
            target_part = _part(target)
            if target_part == part:
                continue
            if "public" in allowed:
                ok = _is_public(target)
            elif part in BASE:
                ok = target_part in BASE
            elif target_part == "package":
                ok = part in ("top", "package")
            else:
                ok = target_part in allowed
            if not ok:
                found.setdefault((module, target),
                                 f"{path.name}:{line}: {module} ({part}) imports {target} ({target_part})")
    return found


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph = {
        m: sorted({t for t, _ in _imports(m, p) if t != m and t.split(".")[0] == "raylog"})
        for m, p in MODULES.items()
        if m.split(".")[0] == "raylog"
    }
    index, low, stack, on_stack, result = {}, {}, [], set(), []
    counter = [0]

    def strongconnect(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                strongconnect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in graph:
            if node not in index:
                strongconnect(node)
    finally:
        sys.setrecursionlimit(limit)
    return result


def test_the_walk_sees_lazy_and_relative_imports():
    """The reader finds imports inside functions and resolves submodules."""
    source = (
        "import os\n"
        "from raylog.storage import message, segment\n"
        "def f():\n"
        "    from raylog.actors import supervisor\n"
        "    if True:\n"
        "        import raylog.zk.paths\n"
        "    from . import fileops\n"
    )
    found = {t for t, _ in _imports_in("raylog.storage.log", False, source)}
    assert found == {
        "raylog.storage.message",
        "raylog.storage.segment",
        "raylog.actors.supervisor",
        "raylog.zk.paths",
        "raylog.storage.fileops",
    }


def test_base_modules_import_only_the_base():
    bad = [text for (module, _), text in violations().items() if _part(module) in BASE]
    assert not bad, "\n".join(bad)


def test_no_import_against_design_section_1():
    found = {key: text for key, text in violations().items() if key not in PENDING}
    assert not found, "imports against docs/design.md section 1:\n" + "\n".join(sorted(found.values()))


def test_every_pending_exception_is_still_needed():
    stale = sorted(set(PENDING) - set(violations()))
    assert not stale, f"fixed, so drop them from PENDING: {stale}"


def test_the_walk_finds_a_forbidden_import_put_back(tmp_path, monkeypatch):
    """One forbidden import (zk importing replication, lazily) is caught."""
    path = tmp_path / "registry.py"
    path.write_text(MODULES["raylog.zk.registry"].read_text() + "\n\ndef _f():\n    from raylog.replication import state\n")
    monkeypatch.setitem(MODULES, "raylog.zk.registry", path)
    assert ("raylog.zk.registry", "raylog.replication.state") in violations()


def test_no_import_cycle_in_raylog():
    found = cycles()
    assert not found, "import cycles in raylog/:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("row", sorted(TABLE))
def test_the_table_names_real_folders(row):
    for target in TABLE[row] | {row}:
        assert target in FOLDERS | BASE | {"top", "public", "spark", "metadata"}, target
