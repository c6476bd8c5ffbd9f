"""The layering of docs/design.md section 1, read from the design and checked
over every import.

The table of section 1 is parsed out of ``docs/design.md`` each run (no copy
of it lives here): :func:`read_table` turns its rows into :class:`Row` s.
Every ``import`` and ``from ... import`` in ``raylog/`` and in
``integrations/spark/raylog_spark`` is read with :mod:`ast` -- module-level
ones and the ones inside functions, methods and ``if`` blocks alike -- and
held against those rows; a second check walks the import graph of
``raylog/`` at module granularity (lazy imports included) and fails on any
cycle, and a third that the top level holds only the base and the public API.

How a row is read (:func:`_read_row`; a row that fits none of these fails
the run, naming the row):

* first column: ``base: `raylog/config.py`, `errors.py`, ...`` names the base
  modules (files of the top level); ``raylog/<folder>/`` names a folder
  (several, comma-separated, share the row's rule but are folders of their
  own); ```raylog/` top level`` is the top level, whose public API files are
  the ``*.py`` names the second column quotes; ``integrations/<x>/`` stands
  for the Python packages in that folder (``raylog_spark``); a folder
  outside ``raylog/`` and ``integrations/`` with an empty third column
  (``deploy/``, ``bench/``) holds no Python the rule applies to;
* third column: a comma-separated list of rows (``base`` or a folder's
  name) that the row may import, with what those may import in turn (so
  ``groups`` -> ``zk`` -> ``storage`` -> ``base``); ``each other only``: the
  row's own modules; ``all of the above``: every row above it in the table;
  ``all of the above but X``: the same without row ``X``; ``the public
  API``: only the public API (:func:`_public`).

The public API (:func:`_public`) is the package ``raylog`` itself, the
public API files the top level's row names (``startup``, ``client``,
``zookeeper``, ``avro``), the base (what ``raylog`` re-exports: the errors,
``TopicConfig``, ``RetryPolicy``), and the packages the API reference
(``docs/reference/api.md``) documents objects of by the package's own name
(``::: raylog.read.plan_read`` -> ``raylog.read``; likewise
``raylog.producer``, ``raylog.consumer``, ``raylog.metadata``,
``raylog.mirror``, ``raylog.pool``, ``raylog_spark``), whose ``__init__``
hold everything public of them. A module of a folder imports its own folder
freely.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import sys
from pathlib import Path

import pytest

from tests.source_trees import parse

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
API_REFERENCE = ROOT / "docs" / "reference" / "api.md"
SOURCES = (ROOT / "raylog", ROOT / "integrations" / "spark" / "raylog_spark")


class TableError(AssertionError):
    """A row of docs/design.md section 1 this reader cannot interpret."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: its name, the modules it holds, its rule."""

    name: str  # "base", "top", a folder's name ("storage"), or an integration's package ("raylog_spark")
    modules: tuple[str, ...]  # dotted prefixes of the modules it holds ("raylog.storage", "raylog.config", ...)
    rule: str  # the third column as written
    public: tuple[str, ...] = ()  # the top level's public API modules ("raylog.client", ...)
    line: int = 0  # the table line it comes from (folders of one line are not "above" each other)


def section_1(text: str) -> list[str]:
    """The table rows (lines) of section 1 of the design's text."""
    match = re.search(r"^## 1\..*?$(.*?)^## ", text, re.S | re.M)
    if match is None:
        raise TableError("docs/design.md has no section '## 1.' followed by another section")
    lines = [line.strip() for line in match.group(1).splitlines() if line.strip().startswith("|")]
    if len(lines) < 3 or not re.fullmatch(r"\|(\s*-+\s*\|)+", lines[1].replace(" ", "")):
        raise TableError(f"section 1 of docs/design.md holds no table: {lines[:2]}")
    return lines[2:]


def _cells(line: str) -> list[str]:
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if len(cells) != 3:
        raise TableError(f"a row of section 1 has {len(cells)} columns, not 3 (folder, owns, may import): {line}")
    return cells


def _quoted(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _read_row(line: str) -> list[Row]:
    """The rows one line of the table stands for (several folders may share one)."""
    folder, owns, rule = _cells(line)
    if folder.startswith("base:"):
        names = [Path(name).stem for name in _quoted(folder)]
        if not names or not all(name.endswith(".py") for name in _quoted(folder)):
            raise TableError(f"the base row names no .py files: {line}")
        return [Row("base", tuple(f"raylog.{name}" for name in names), rule)]
    if re.fullmatch(r"`raylog/` top level", folder):
        public = tuple(f"raylog.{Path(name).stem}" for name in _quoted(owns) if name.endswith(".py"))
        if not public:
            raise TableError(f"the top level's row names no public API files (`x.py`) in its second column: {line}")
        return [Row("top", ("raylog",), rule, public)]
    paths = _quoted(folder)
    if not paths or re.sub(r"`[^`]+`|,|\s", "", folder):
        raise TableError(f"cannot read the first column (expected `raylog/<folder>/`, ...): {line}")
    rows = []
    for path in paths:
        parts = path.strip("/").split("/")
        if parts[0] == "raylog" and len(parts) == 2:
            rows.append(Row(parts[1], (f"raylog.{parts[1]}",), rule))
        elif parts[0] == "integrations" and len(parts) == 2:
            packages = sorted(p.parent.name for p in (ROOT / path).glob("*/__init__.py"))
            if not packages:
                raise TableError(f"{path} holds no Python package: {line}")
            rows.extend(Row(package, (package,), rule) for package in packages)
        elif len(parts) == 1 and not rule:
            continue  # deploy/, bench/: no Python the layering applies to
        else:
            raise TableError(f"cannot read folder {path!r} (expected raylog/<folder>/ or integrations/<x>/): {line}")
    return rows


def read_table(text: str) -> list[Row]:
    """Every row of section 1, in the table's order; each rule checked readable."""
    rows = [dataclasses.replace(row, line=number)
            for number, line in enumerate(section_1(text)) for row in _read_row(line)]
    names = [row.name for row in rows]
    if len(set(names)) != len(names):
        raise TableError(f"a folder has two rows: {names}")
    for index, row in enumerate(rows):
        _rule_targets(rows, index)  # raises on a rule it cannot read
    return rows


PUBLIC = "the public API"


def _rule_targets(rows: list[Row], index: int) -> set[str] | str:
    """What row ``rows[index]`` names in its third column: a set of row
    names, or :data:`PUBLIC`."""
    row = rows[index]
    rule = row.rule.strip().rstrip(".")
    above = [r.name for r in rows if r.line < row.line]
    if rule == PUBLIC:
        return PUBLIC
    if rule == "each other only":
        return set()
    if rule == "all of the above":
        return set(above)
    but = re.fullmatch(r"all of the above but (.+)", rule)
    if but:
        excluded = {name.strip() for name in re.split(r",|\band\b", but.group(1)) if name.strip()}
        unknown = excluded - set(above)
        if unknown:
            raise TableError(f"row {row.name!r}: 'but {', '.join(sorted(unknown))}' names no row above it")
        return set(above) - excluded
    names = {name.strip() for name in rule.split(",") if name.strip()}
    if not names or not all(re.fullmatch(r"[a-z_]+", name) for name in names):
        raise TableError(f"row {row.name!r}: cannot read its third column {row.rule!r}")
    unknown = names - set(above)
    if unknown:
        raise TableError(f"row {row.name!r} may import {sorted(unknown)}, which name no row above it")
    return names


@dataclasses.dataclass(frozen=True)
class Layers:
    """The table as the checker uses it: each row's closure of what it may import."""

    rows: tuple[Row, ...]
    allowed: dict  # row name -> set of row names, or PUBLIC

    @classmethod
    def of(cls, rows: list[Row]) -> "Layers":
        direct = {row.name: _rule_targets(rows, i) for i, row in enumerate(rows)}
        allowed = {}
        for name, targets in direct.items():
            if targets == PUBLIC:
                allowed[name] = PUBLIC
                continue
            seen, todo = set(), list(targets)
            while todo:
                target = todo.pop()
                if target not in seen:
                    seen.add(target)
                    further = direct[target]
                    todo.extend(() if further == PUBLIC else further)
            allowed[name] = seen
        return cls(tuple(rows), allowed)

    @functools.cached_property
    def top(self) -> Row:
        return next(row for row in self.rows if row.name == "top")

    @functools.cached_property
    def base(self) -> Row:
        return next(row for row in self.rows if row.name == "base")

    def row_of(self, module: str) -> str | None:
        """The row ``module`` belongs to (longest prefix wins), or None."""
        best, length = None, -1
        for row in self.rows:
            for prefix in row.modules + row.public:
                if prefix == "raylog" and module != "raylog" and row.name == "top":
                    continue  # the top row holds the package itself and its public files only
                if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                    best, length = row.name, len(prefix)
        return best


def _documented_packages() -> set[str]:
    """The packages whose own name the API reference documents objects
    under (``::: raylog.read.plan_read`` -> ``raylog.read``), when they are packages."""
    found = set()
    for target in re.findall(r"^::: ([\w.]+)", API_REFERENCE.read_text(), re.M):
        package = target.rpartition(".")[0]
        if package and any((source.parent / package.replace(".", "/") / "__init__.py").exists() for source in SOURCES):
            found.add(package)
    return found


def _public(layers: Layers) -> set[str]:
    """The modules of the public API (see the module docstring)."""
    documented = {p for p in _documented_packages() if p in ("raylog_spark",) or p.count(".") == 1}
    return {"raylog", *layers.top.public, *layers.base.modules, *documented}


LAYERS = Layers.of(read_table(DESIGN.read_text()))


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


def _folder(module: str) -> str:
    """A module's own folder (``raylog.storage``), or the module itself at the top level."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "raylog" else parts[0]


def check(modules: dict[str, Path], layers: Layers = LAYERS) -> dict[tuple[str, str], str]:
    """``{(importer, imported): "path:line: ..."}`` for every import against the table."""
    public = _public(layers)
    found = {}
    for module, path in modules.items():
        row = layers.row_of(module)
        if row is None:
            continue  # a loose module: test_the_top_level_holds_only_base_and_public_api names it
        allowed = layers.allowed[row]
        for target, line in _imports(module, path):
            target_row = layers.row_of(target)
            if _folder(target) == _folder(module) and row != "top":
                continue  # a folder's own modules (and the base among each other, below)
            if allowed == PUBLIC:
                ok = target in public or target.split(".")[0] == row  # an integration's own package
            else:
                ok = target_row is not None and (target_row == row or target_row in allowed)
            if not ok:
                found.setdefault((module, target), f"{path.name}:{line}: {module} ({row}) imports {target} "
                                                    f"({target_row or 'no row of the table'})")
    return found


def violations() -> dict[tuple[str, str], str]:
    return check(MODULES)


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


def test_the_table_is_read_from_the_design_with_every_folder():
    """Every package folder of raylog/ (and the Spark integration) has a
    row, mirror/ and pool/ included; every row names real modules."""
    names = {row.name for row in LAYERS.rows}
    folders = {p.parent.name for p in (ROOT / "raylog").glob("*/__init__.py")}
    assert folders - names == set(), f"folders of raylog/ without a row in docs/design.md section 1: {folders - names}"
    assert {"mirror", "pool", "metadata", "admin", "kafka", "raylog_spark"} <= names
    for row in LAYERS.rows:
        for module in row.modules + row.public:
            assert module in MODULES, f"row {row.name!r} names {module}, which is not a module"
    assert LAYERS.allowed["groups"] == {"zk", "storage", "base"}
    assert "actors" not in LAYERS.allowed["kafka"] and "kafka" in LAYERS.allowed["admin"]
    assert LAYERS.allowed["base"] == set() and LAYERS.allowed["tools"] == PUBLIC


def test_the_top_level_holds_only_base_and_public_api():
    """A top-level module that is neither base nor public API belongs in a folder (section 1)."""
    top_level = {m for m in MODULES if m.startswith("raylog.") and m.count(".") == 1}
    folders = {f"raylog.{p.parent.name}" for p in (ROOT / "raylog").glob("*/__init__.py")}
    allowed = set(LAYERS.base.modules) | set(LAYERS.top.public)
    loose = sorted(top_level - folders - allowed)
    assert not loose, f"modules of raylog/'s top level that are neither base nor public API: {loose}"
    so = sorted(p.name for p in (ROOT / "raylog").glob("*.so"))
    assert not so, f"compiled modules at raylog/'s top level: {so}"


def test_base_modules_import_only_the_base():
    bad = [text for (module, _), text in violations().items() if LAYERS.row_of(module) == "base"]
    assert not bad, "\n".join(bad)


def test_no_import_against_design_section_1():
    found = violations()
    assert not found, "imports against docs/design.md section 1:\n" + "\n".join(sorted(found.values()))


def _planted(tmp_path, module: str, line: str) -> dict[str, Path]:
    path = tmp_path / MODULES[module].name
    path.write_text(MODULES[module].read_text() + f"\n\ndef _planted():\n    {line}\n")
    return {**MODULES, module: path}


@pytest.mark.parametrize("module, line, target", [
    # zk importing replication, lazily: a row naming only "storage, base"
    ("raylog.zk.registry", "from raylog.replication import state", "raylog.replication.state"),
    # kafka: "all of the above but actors"
    ("raylog.kafka.service", "from raylog.actors import placement", "raylog.actors.placement"),
    # kafka may not import admin/, a row below it
    ("raylog.kafka.launch", "import raylog.admin.topics", "raylog.admin.topics"),
    # the base: "each other only"
    ("raylog.errors", "from raylog.storage import message", "raylog.storage.message"),
    # tools: "the public API" only
    ("raylog.tools.cli", "from raylog.zk import registry", "raylog.zk.registry"),
    # the Spark integration likewise
    ("raylog_spark.writer", "from raylog.admin.offsets import offset_store", "raylog.admin.offsets"),
])
def test_a_planted_forbidden_import_is_reported(tmp_path, module, line, target):
    """The checker, run with the table read from docs/design.md, reports an
    import that the table forbids when one is planted in a module's text."""
    assert (module, target) not in violations()
    assert (module, target) in check(_planted(tmp_path, module, line))


def test_the_rule_comes_from_the_design_text():
    """Edit the design's text (groups may no longer import zk) and the
    real imports of groups/ are reported: the checker reads the table, it
    keeps no copy."""
    text = DESIGN.read_text()
    edited = re.sub(r"(\| `raylog/groups/` \|[^|]*\|) zk \|", r"\1 base |", text)
    assert edited != text
    found = check(MODULES, Layers.of(read_table(edited)))
    assert any(importer.startswith("raylog.groups.") and imported.startswith("raylog.zk")
               for importer, imported in found)


@pytest.mark.parametrize("row, message", [
    ("| `raylog/x/` | y | whatever goes |", "cannot read its third column"),
    ("| `raylog/x/` | y | storage, nowhere |", "which name no row above it"),
    ("| `raylog/x/` | y | all of the above but nothing |", "names no row above it"),
    ("| raylog x | y | base |", "cannot read the first column"),
    ("| `raylog/x/` | y |", "not 3"),
])
def test_a_row_it_cannot_read_fails_loudly(row, message):
    text = DESIGN.read_text()
    table = section_1(text)
    edited = text.replace(table[1], table[1] + "\n" + row, 1)
    with pytest.raises(TableError, match=message):
        read_table(edited)


def test_no_import_cycle_in_raylog():
    found = cycles()
    assert not found, "import cycles in raylog/:\n" + "\n".join(" <-> ".join(c) for c in found)
