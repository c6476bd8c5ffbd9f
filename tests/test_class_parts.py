"""No class of raylog is assembled from mixins: a raylog class used as a
base defines every attribute and method its own code uses on ``self``
(or inherits it from raylog bases that do). A base that uses what only its
subclass provides is a mixin, whose inputs nobody can see; give the part
its inputs in a constructor instead (docs: ARCHITECTURE.md).

Read from the source with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
import pathlib

from tests.source_trees import parse

ROOT = pathlib.Path(__file__).resolve().parents[1] / "raylog"

#: bases that another piece of work reshapes, each with the reason it stays for now
KNOWN: dict[str, str] = {}


def _classes() -> dict[str, ast.ClassDef]:
    found: dict[str, ast.ClassDef] = {}
    for path in sorted(ROOT.rglob("*.py")):
        tree = parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, node)
    return found


def _base_names(cls: ast.ClassDef) -> list[str]:
    names = []
    for base in cls.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
        else:
            names.append("?")
    return names


def _defined(cls: ast.ClassDef) -> set[str]:
    names = set()
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


def _used(cls: ast.ClassDef) -> set[str]:
    return {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }


def _undefined(name: str, classes: dict[str, ast.ClassDef]) -> set[str] | None:
    """What class ``name`` uses on ``self`` and neither it nor its raylog
    bases define; None when a base is not raylog's (its attributes are
    unknown here)."""
    cls = classes[name]
    defined = set()
    todo = [cls]
    while todo:
        current = todo.pop()
        defined |= _defined(current)
        for base in _base_names(current):
            if base == "object":
                continue
            if base not in classes:
                return None
            todo.append(classes[base])
    return {attr for attr in _used(cls) - defined if not attr.startswith("__")}


def test_every_raylog_base_class_defines_what_it_uses():
    classes = _classes()
    bases = {base for cls in classes.values() for base in _base_names(cls) if base in classes}
    mixins = {}
    for name in sorted(bases - set(KNOWN)):
        missing = _undefined(name, classes)
        if missing:
            mixins[name] = sorted(missing)
    assert not mixins, (
        f"these raylog classes are bases of others and use on self what they do not define (mixins): "
        f"{mixins}; make each a part with its inputs given in its constructor"
    )


def test_the_check_finds_a_mixin():
    tree = ast.parse(
        "class Part:\n    def go(self):\n        return self._host_thing()\n"
        "class Host(Part):\n    def _host_thing(self):\n        return 1\n"
    )
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    assert _undefined("Part", classes) == {"_host_thing"}
    assert _undefined("Host", classes) == set()
