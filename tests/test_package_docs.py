"""Each package's docstring (its ``__init__``) describes the modules that
exist: every ``:mod:`` it names is a module of the tree, and the storage
package's list, one concept per module, names every module it holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent for p in (ROOT / "raylog").rglob("__init__.py"))


def _docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


def _exists(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists() or path.with_suffix(".c").exists()


def _named_modules(text: str, package: str) -> set[str]:
    """The modules ``:mod:`` roles of ``text`` name (``~`` and relative forms resolved)."""
    found = set()
    for target in re.findall(r":mod:`~?([\w.]+)`", text):
        found.add(target if target.startswith("raylog") else f"{package}.{target.lstrip('.')}")
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_package_docstring_names_only_modules_that_exist(package):
    dotted = ".".join(package.relative_to(ROOT).parts)
    missing = sorted(m for m in _named_modules(_docstring(package), dotted) if not _exists(m))
    assert not missing, f"{dotted}'s docstring names modules that do not exist: {missing}"


@pytest.mark.parametrize("package", ["storage", "kafka"])
def test_the_docstring_names_every_module_of_the_package(package):
    text = _docstring(ROOT / "raylog" / package)
    named = _named_modules(text, f"raylog.{package}") | set(re.findall(rf"``(raylog\.{package}\.\w+)``", text))
    modules = {f"raylog.{package}.{p.stem}" for p in (ROOT / "raylog" / package).glob("*.py") if p.stem != "__init__"}
    modules |= {f"raylog.{package}.{p.name.split('.')[0]}" for p in (ROOT / "raylog" / package).glob("_*.c")}
    assert modules - named == set(), f"modules of raylog/{package}/ its docstring leaves out: {modules - named}"


FOLDERS = sorted(p.parent.name for p in (ROOT / "raylog").glob("*/__init__.py"))


def _table_lines(page: str) -> list[str]:
    return [line for line in (ROOT / page).read_text().splitlines() if line.startswith("|")]


def test_the_concepts_table_has_a_row_for_every_folder():
    """docs/concepts.md's table of parts: each package folder of raylog/ has a row of its own."""
    firsts = [line.split("|")[1] for line in _table_lines("docs/concepts.md")]
    missing = [f for f in FOLDERS if not any(f"`raylog/{f}/`" in first for first in firsts)]
    assert not missing, f"docs/concepts.md has no row for: {missing}"


def test_architecture_places_every_folder():
    """ARCHITECTURE.md's tables (the one-message walk and the rooms around
    it) name every package folder of raylog/."""
    lines = "\n".join(_table_lines("ARCHITECTURE.md"))
    missing = [f for f in FOLDERS if f"raylog/{f}/" not in lines]
    assert not missing, f"ARCHITECTURE.md's tables do not name: {missing}"
