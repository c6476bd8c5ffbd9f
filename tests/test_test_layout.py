"""The suite's own layout: pytest imports test modules by their basename
(rootdir-relative "prepend" import mode, no __init__.py), so two test
files with one name in different folders stop the whole run at collection.
This test names them before that happens."""

from __future__ import annotations

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def test_every_test_module_has_a_name_of_its_own():
    places = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        places[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in places.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
