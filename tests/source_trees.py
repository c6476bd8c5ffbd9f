"""Parsing raylog's own source for the tests that read it with ``ast``.

Python 3.11 before 3.11.8 keeps the depth counter of its AST constructor in
one place for the whole interpreter, so an ``ast.parse`` that runs while
another thread of the same process parses too (Ray's and Spark's helper
threads live in the test process) can fail with ``SystemError: AST
constructor recursion depth mismatch`` although the source is fine
(CPython issue 106905). ``parse`` tries such a parse again; any other error,
and a mismatch that keeps happening, is raised as it is."""

from __future__ import annotations

import ast

#: parses tried before a mismatch is raised
ATTEMPTS = 5


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for attempt in range(ATTEMPTS):
        try:
            return ast.parse(source, filename)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
