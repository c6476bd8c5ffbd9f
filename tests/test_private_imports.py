"""No module takes a ``_``-prefixed name from another module: a name one
module shares is public there (issue 45).

Every ``from raylog... import _x`` (and ``raylog_spark``) in ``raylog/``,
``integrations/``, ``tests/`` and ``bench/`` is found, the imports inside
functions included. The sources are read with a pattern, not parsed: the
test's answer never depends on the state another test left the interpreter
in. A compiled module (``_speedups``, ``_fastsend``, ``_kafkarecords``, ``_compaction``) is a
module's name, not a private one.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPILED = {"_speedups", "_fastsend", "_kafkarecords", "_compaction"}


#: ``from raylog... import`` a name list: on one line, or parenthesized over several
IMPORT = re.compile(r"^[ \t]*from[ \t]+((?:raylog|raylog_spark)(?:\.\w+)*)[ \t]+import[ \t]+"
                    r"(\([^)]*\)|[^\n]*)", re.MULTILINE)


def imported_names(text: str):
    """``(line number, module, name)`` of each name a ``from raylog... import``
    of ``text`` takes (read from the text: no parse, so a source any Python
    reads is read the same whatever state the interpreter is in)."""
    for match in IMPORT.finditer(text):
        names = re.sub(r"#[^\n]*", "", match.group(2)).strip("()")
        line = text.count("\n", 0, match.start()) + 1
        for part in names.split(","):
            name = part.split(" as ")[0].strip().rstrip("\\").strip()
            if name:
                yield line, match.group(1), name


def private_imports() -> list[str]:
    found = []
    for folder in ("raylog", "integrations", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, module, name in imported_names(path.read_text()):
                if name.startswith("_") and name not in COMPILED:
                    found.append(f"{rel}:{line}: from {module} import {name}")
    return found


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []


def test_the_pattern_finds_private_names_in_every_form_of_import():
    text = ("from raylog.storage.message import A, _b\n"
            "    from raylog.kafka import (\n        c,\n        _d as e,  # why\n    )\n"
            "from raylog_spark.jvm import _f\nfrom os import _g\nfrom raylog.storage import _speedups\n")
    assert [(line, name) for line, _module, name in imported_names(text) if name.startswith("_")] == [
        (1, "_b"), (2, "_d"), (6, "_f"), (8, "_speedups")]
