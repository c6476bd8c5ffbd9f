"""The public surface: ``raylog.__all__`` and the API reference
(docs/reference/api.md) list the same names.

A name of the reference is one of the package's when the object a ``:::``
line documents is what ``raylog`` gives under its own name
(``::: raylog.startup.connect`` documents ``raylog.connect``); the block
``::: raylog.errors`` documents every error class. Objects the reference
documents that ``raylog`` does not give (``raylog.read.plan_read``,
``raylog_spark.read_topic``, ...) belong to other public packages and are
not counted here.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import raylog
from raylog import errors

ROOT = Path(__file__).resolve().parents[1]
API_REFERENCE = ROOT / "docs" / "reference" / "api.md"


def _resolve(target: str):
    """The object a ``:::`` target names (a module, or an attribute of one)."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"the API reference documents {target}, which does not import")


def documented_names(text: str) -> set[str]:
    """The names of ``raylog`` that a reference page's ``:::`` lines document."""
    names = set()
    for target in re.findall(r"^::: ([\w.]+)", text, re.M):
        obj = _resolve(target)
        if inspect.ismodule(obj):
            if obj is errors:
                names |= {name for name, value in vars(errors).items()
                          if inspect.isclass(value) and issubclass(value, errors.RaylogError)}
            continue
        name = getattr(obj, "__name__", target.rpartition(".")[2])
        if getattr(raylog, name, None) is obj:
            names.add(name)
    return names


def test_all_and_the_api_reference_list_the_same_names():
    exported = set(raylog.__all__)
    documented = documented_names(API_REFERENCE.read_text())
    assert not exported - documented, f"in raylog.__all__ but not in the API reference: {sorted(exported - documented)}"
    assert not documented - exported, f"in the API reference but not in raylog.__all__: {sorted(documented - exported)}"


def test_every_name_of_all_is_given_by_raylog():
    for name in raylog.__all__:
        assert getattr(raylog, name) is not None, name
    assert len(raylog.__all__) == len(set(raylog.__all__))


def test_every_error_class_is_in_all():
    classes = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, errors.RaylogError)}
    assert classes <= set(raylog.__all__)


def test_a_name_missing_from_the_reference_is_seen():
    """Take one documented name out of the page's text: the comparison sees it."""
    text = API_REFERENCE.read_text()
    assert "::: raylog.retry.RetryPolicy\n" in text
    assert "RetryPolicy" not in documented_names(text.replace("::: raylog.retry.RetryPolicy\n", ""))
