"""No module takes a ``_``-prefixed name from another module: a name one
module shares is public there (issue 45).

Every ``from raylog... import _x`` (and ``raylog_spark``) in ``raylog/``,
``integrations/``, ``tests/`` and ``bench/`` is read with :mod:`ast`, the
imports inside functions included. A compiled module (``_speedups``,
``_fastsend``, ``_kafkarecords``) is a module's name, not a private one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPILED = {"_speedups", "_fastsend", "_kafkarecords"}


def private_imports() -> list[str]:
    found = []
    for folder in ("raylog", "integrations", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(), filename=rel)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.module
                        and node.module.split(".")[0] in ("raylog", "raylog_spark")):
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and alias.name not in COMPILED:
                        found.append(f"{rel}:{node.lineno}: from {node.module} import {alias.name}")
    return found


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []
