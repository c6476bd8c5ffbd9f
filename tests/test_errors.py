"""The error hierarchy: one base, codes that round-trip, details kept."""

from __future__ import annotations

import pickle

import pytest

import raylog
from raylog import errors


def _all_errors():
    return [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, errors.RaylogError)
    ]


def test_every_error_derives_from_one_base_and_is_public():
    for cls in _all_errors():
        assert issubclass(cls, raylog.RaylogError)
        assert getattr(raylog, cls.__name__) is cls
        assert isinstance(cls.retriable, bool)
        assert cls.__doc__, f"{cls.__name__} says nothing about what to do next"


def test_codes_are_unique_and_map_back_to_their_class():
    codes = {}
    for cls in _all_errors():
        assert cls.code not in codes, f"{cls.__name__} and {codes.get(cls.code)} share code {cls.code}"
        codes[cls.code] = cls.__name__
        err = errors.error_for_code(cls.code, "message", offset=7)
        assert type(err) is cls and str(err) == "message" and err.offset == 7


def test_unknown_code_gives_the_base_class():
    assert type(errors.error_for_code(9999, "odd")) is errors.RaylogError


@pytest.mark.parametrize("cls", _all_errors())
def test_errors_survive_pickling_with_their_details(cls):
    err = cls("what to do next", offset=1, earliest=0, latest=5)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls and str(again) == "what to do next"
    assert (again.offset, again.earliest, again.latest) == (1, 0, 5)


def test_retriable_errors_are_the_transient_ones():
    assert errors.BrokerUnavailableError.retriable and errors.ZooKeeperUnavailableError.retriable
    assert errors.NotOwnerError.retriable
    assert not errors.StaleEpochError.retriable and not errors.PartitionNotAssignedError.retriable
    assert not errors.CorruptMessageError.retriable and not errors.OffsetOutOfRangeError.retriable


#: the errors after which a client looks the partition's endpoint up again
REFRESH_METADATA = {
    "NotOwnerError",  # this endpoint does not serve the partition
    "StaleEpochError",  # a newer incarnation serves it, at its own endpoint
    "BrokerUnavailableError",  # unreachable, connection lost, or no endpoint registered
    "TooManyConnectionsError",  # (a BrokerUnavailableError)
    "RequestTimeoutError",  # no reply: the actor may be gone
}


def test_refresh_metadata_per_class():
    table = {cls.__name__: cls.refresh_metadata for cls in _all_errors()}
    assert all(isinstance(v, bool) for v in table.values())
    assert {name for name, refresh in table.items() if refresh} == REFRESH_METADATA
    # the consumer's commit refusal is about the group, not the endpoint
    assert not errors.PartitionNotAssignedError.refresh_metadata
    # kept across processes, like every class attribute
    err = pickle.loads(pickle.dumps(errors.NotOwnerError("moved", topic="t", partition=0)))
    assert err.refresh_metadata and err.retriable


def test_errors_moved_here_keep_their_bases():
    assert issubclass(errors.LogInUseError, errors.StorageError) and errors.LogInUseError.retriable
    assert issubclass(errors.FaultInjectionError, AssertionError)
    with pytest.raises(AssertionError):
        raise errors.FaultInjectionError("the fault did not happen")
    assert not errors.ConcurrentLoadError.retriable


def draw_tree() -> list[str]:
    """The error classes of raylog.errors as a tree under ``Exception``, in
    source order; a class's first base is its parent, and another base
    from outside raylog.errors is named after it as ``(also X)``."""
    classes = [obj for obj in vars(errors).values()
               if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__]
    children: dict[type, list[type]] = {}
    for cls in classes:
        children.setdefault(cls.__bases__[0], []).append(cls)

    def label(cls: type) -> str:
        extra = [base.__name__ for base in cls.__bases__[1:]]
        return cls.__name__ + (f" (also {', '.join(extra)})" if extra else "")

    lines = ["Exception"]

    def walk(parent: type, prefix: str) -> None:
        kids = children.get(parent, [])
        for i, cls in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(prefix + ("└── " if last else "├── ") + label(cls))
            walk(cls, prefix + ("    " if last else "│   "))

    walk(Exception, "")
    return lines


def test_the_docstring_draws_the_tree_of_every_error_class():
    """raylog.errors' docstring holds the hierarchy as it is (every class,
    each under its base), drawn as :func:`draw_tree` draws it."""
    drawn = [line[4:] for line in errors.__doc__.splitlines() if line.startswith("    ")]
    tree = draw_tree()
    assert len(tree) == len([cls for cls in _all_errors()]) + 1
    assert drawn == tree, "redraw the tree in raylog/errors.py's docstring:\n" + "\n".join(
        "    " + line for line in tree)


def test_the_tree_drawing_sees_a_class_moved_in_the_tree(monkeypatch):
    """A class put under another base no longer matches the drawing."""
    class Moved(errors.ConfigError):
        """Moved."""

    Moved.__module__ = errors.__name__
    monkeypatch.setattr(errors, "Moved", Moved, raising=False)
    assert any(line.endswith("── Moved") for line in draw_tree())
    drawn = [line[4:] for line in errors.__doc__.splitlines() if line.startswith("    ")]
    assert drawn != draw_tree()
