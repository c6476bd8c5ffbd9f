"""Assignors: who gets which partition, as pluggable pure functions.

There is no group leader (docs/design.md §4): every member reads the same
ZooKeeper nodes — the members under ``ids/`` with their subscriptions and the
assignors they support, each subscribed topic's partition count and, for an
assignor that asks for it, the owners under ``owners/`` — and computes the
whole group's assignment itself. So an assignor must be a *pure, deterministic*
function of what it is given: the same answer on every member, whatever the
order of its inputs, with no clock, randomness or state of its own.

The interface (:class:`Assignor`) is an object with

- ``name``: a short string written into the member's ``ids/`` node, so the
  members can agree on one (:func:`choose`);
- ``assign(members, partition_counts, owners)``: ``members`` a sequence of
  :class:`MemberInfo` (id, subscribed topics, supported assignors, when it
  joined), ``partition_counts`` ``{topic: count}`` for every topic a member
  subscribes to, ``owners`` ``{(topic, p): member id}`` as ZooKeeper shows
  them (empty unless the assignor sets ``reads_owners``); it returns
  ``{member id: iterable of (topic, p)}`` giving each partition of a
  subscribed topic to exactly one member subscribed to that topic
  (:func:`assign` checks this and raises :class:`raylog.errors.AssignorError`
  otherwise);
- optionally ``reads_owners = True``: the members read the owner nodes before
  assigning, and a member calls its rebalance done only once it has seen the
  group hold exactly the assignment it computed (so members that read the
  owners at different moments still end up agreeing).

The built-in assignors (:data:`BUILTIN`):

``range`` (the default, and the paper's): per topic, the subscribed members
    sorted by id take contiguous ranges, member *i* of *C* ⌊P/C⌋ partitions
    plus one if *i* < P mod C. Every raylog version computes it, so it is what
    a member that lists no assignors (an older version) supports.
``round_robin`` (Kafka's ``RoundRobinAssignor``): all partitions of all
    subscribed topics, sorted by topic and number, dealt one at a time to the
    members sorted by id, skipping members not subscribed to the partition's
    topic. Spreads several small topics evenly.
``sticky``: per topic, balanced like ``range`` (counts differ by at most
    one) but moving as few partitions as possible: members are ranked by
    when they joined (the ``ids/`` node's creation, oldest first), the
    oldest ``P mod C`` may hold one more; each member keeps the
    lowest-numbered partitions it owns now, up to its quota, and the
    partitions left over go, lowest first, to the members below their quota
    in rank order. A member that joins is ranked last and takes only what
    it must; a member that leaves gives its partitions to the others and
    nobody else moves.

Why ``sticky`` agrees across members that read ``owners/`` at different
moments of one rebalance: each partition moves at most once (from its owner
to nobody to its new owner), a member's kept partitions are the lowest ones
it owns and its quota does not depend on ownership, and the partitions a
member lacks come from one contiguous run of the sorted free partitions; so
every view between the start and the end of the moves gives the same
answer. The "done only at the fixpoint" rule above covers the rest (a
membership change in between).

Choosing (:func:`choose`): the group applies the first assignor, in the
order of its *oldest* member's list, that every member supports; when there
is none (say a member of an older version, which supports ``range`` only,
and one that lists only ``sticky``) it applies ``range``, which every member
can compute.

A user's own assignor is any object with ``name`` and ``assign`` as above,
passed in the consumer's ``partition_assignment_strategy``; every member of
the group that lists it must run the same code. Its name may not be one of
the built-in names.

Pure and stateless: no ZooKeeper, no threads, no clock. The assignor
objects here keep no state, so one instance serves any number of members.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

from raylog.errors import AssignorError
from raylog.groups.assignment import Assignment, TopicPartition, range_assignment

log = logging.getLogger(__name__)

#: what a member that lists no assignors (an older version) supports
DEFAULT_NAMES: tuple[str, ...] = ("range",)
#: ``joined`` of a member whose ids node could not be read: ranked last
UNKNOWN_JOINED = 2**63 - 1


class MemberInfo(NamedTuple):
    """One member as its ``ids/`` node shows it."""

    id: str
    topics: frozenset[str]
    #: the assignors it supports, most preferred first
    assignors: tuple[str, ...] = DEFAULT_NAMES
    #: when it joined: the creation zxid of its ids node (smaller is older)
    joined: int = 0


@runtime_checkable
class Assignor(Protocol):
    """What an assignor is (see the module docstring)."""

    name: str

    def assign(
        self,
        members: Sequence[MemberInfo],
        partition_counts: Mapping[str, int],
        owners: Mapping[TopicPartition, str],
    ) -> Mapping[str, Iterable[TopicPartition]]:
        ...


def _by_id(members: Iterable[MemberInfo]) -> list[MemberInfo]:
    return sorted(members, key=lambda m: m.id)


def _by_age(members: Iterable[MemberInfo]) -> list[MemberInfo]:
    return sorted(members, key=lambda m: (m.joined, m.id))


def _topics(members: Iterable[MemberInfo]) -> list[str]:
    return sorted({t for m in members for t in m.topics})


class RangeAssignor:
    """``range``: contiguous ranges per topic, members by id (the paper's)."""

    name = "range"
    reads_owners = False

    def assign(self, members, partition_counts, owners):
        return range_assignment(partition_counts, {m.id: m.topics for m in members})


class RoundRobinAssignor:
    """``round_robin``: every partition of every topic dealt in turn to the
    members (by id) subscribed to its topic."""

    name = "round_robin"
    reads_owners = False

    def assign(self, members, partition_counts, owners):
        ring = _by_id(members)
        owned: dict[str, set[TopicPartition]] = {m.id: set() for m in ring}
        cursor = 0
        for topic in _topics(ring):
            for p in range(max(0, partition_counts.get(topic, 0))):
                while topic not in ring[cursor % len(ring)].topics:
                    cursor += 1
                owned[ring[cursor % len(ring)].id].add((topic, p))
                cursor += 1
        return owned


class StickyAssignor:
    """``sticky``: balanced per topic, moving the fewest partitions (members
    ranked by when they joined; see the module docstring)."""

    name = "sticky"
    reads_owners = True

    def assign(self, members, partition_counts, owners):
        ranked = _by_age(members)
        owned: dict[str, set[TopicPartition]] = {m.id: set() for m in ranked}
        for topic in _topics(ranked):
            subscribed = [m.id for m in ranked if topic in m.topics]
            count = max(0, partition_counts.get(topic, 0))
            share, extra = divmod(count, len(subscribed))
            quota = {m: share + (1 if i < extra else 0) for i, m in enumerate(subscribed)}
            held: dict[str, list[int]] = {m: [] for m in subscribed}
            for p in range(count):
                holder = owners.get((topic, p))
                if holder in held:
                    held[holder].append(p)
            kept = {m: held[m][:quota[m]] for m in subscribed}
            taken = {p for ps in kept.values() for p in ps}
            free = iter(p for p in range(count) if p not in taken)
            for m in subscribed:
                parts = kept[m] + [next(free) for _ in range(quota[m] - len(kept[m]))]
                owned[m].update((topic, p) for p in parts)
        return owned


#: the built-in assignors by name
BUILTIN: dict[str, Assignor] = {a.name: a for a in (RangeAssignor(), RoundRobinAssignor(), StickyAssignor())}


def resolve(option) -> tuple[Assignor, ...]:
    """The assignors a consumer option names, most preferred first.

    ``option`` is None (``range``), a name, names separated by commas
    (``"sticky,range"``, as Kafka clients write it), or a list of names and
    assignor objects. Raises :class:`AssignorError` for an unknown name, a
    repeated one, an object that is not an assignor, or one that takes a
    built-in name.
    """
    if option is None:
        return tuple(BUILTIN[n] for n in DEFAULT_NAMES)
    if isinstance(option, str):
        items: list = [part.strip() for part in option.split(",")]
    elif isinstance(option, Assignor):
        items = [option]
    else:
        try:
            items = list(option)
        except TypeError:
            raise AssignorError(
                f"partition_assignment_strategy is an assignor name, a list of names and assignor "
                f"objects, or None, got {option!r}; known names: {', '.join(BUILTIN)}") from None
    if not items:
        raise AssignorError(f"partition_assignment_strategy lists no assignor; give at least one of "
                            f"{', '.join(BUILTIN)} (range is the default)")
    out: list[Assignor] = []
    for item in items:
        if isinstance(item, type):
            item = item()  # a class, as kafka-python takes them
        if isinstance(item, str):
            if item not in BUILTIN:
                raise AssignorError(
                    f"unknown assignor {item!r} in partition_assignment_strategy; known names: "
                    f"{', '.join(BUILTIN)}, or pass an object with a name and an assign method", name=item)
            assignor = BUILTIN[item]
        elif isinstance(item, Assignor) and callable(getattr(item, "assign", None)):
            name = item.name
            if not isinstance(name, str) or not name or "," in name or name != name.strip():
                raise AssignorError(f"an assignor's name is a non-empty string without commas or "
                                    f"surrounding spaces, got {name!r} from {item!r}")
            if name in BUILTIN and type(item) is type(BUILTIN[name]):
                item = BUILTIN[name]  # a built-in made anew: the same code
            elif name in BUILTIN:
                raise AssignorError(
                    f"assignor {item!r} takes the built-in name {name!r}: members choosing {name!r} would "
                    f"compute different assignments; give it a name of its own", name=name)
            assignor = item
        else:
            raise AssignorError(
                f"{item!r} is not an assignor: pass a name ({', '.join(BUILTIN)}) or an object with a "
                f"'name' string and an 'assign(members, partition_counts, owners)' method")
        if any(a.name == assignor.name for a in out):
            raise AssignorError(f"assignor {assignor.name!r} is listed twice in partition_assignment_strategy",
                                name=assignor.name)
        out.append(assignor)
    return tuple(out)


def choose(members: Iterable[MemberInfo]) -> str:
    """The name of the assignor the group applies: the first, in the oldest
    member's order, that every member lists; ``range`` when none is."""
    ranked = _by_age(members)
    if not ranked:
        return DEFAULT_NAMES[0]
    for name in ranked[0].assignors:
        if all(name in m.assignors for m in ranked[1:]):
            return name
    return DEFAULT_NAMES[0]


def reads_owners(assignor: Assignor) -> bool:
    """Whether the members read ``owners/`` before running ``assignor``."""
    return bool(getattr(assignor, "reads_owners", False))


def assign(
    assignor: Assignor,
    members: Iterable[MemberInfo],
    partition_counts: Mapping[str, int],
    owners: Mapping[TopicPartition, str] | None = None,
) -> dict[str, Assignment]:
    """Run ``assignor`` and check its answer: ``{member id: frozenset((topic, p))}``
    with every member present and every partition of a subscribed topic
    given to exactly one member subscribed to it. Raises
    :class:`AssignorError` naming what is wrong otherwise."""
    members = list(members)
    result = assignor.assign(members, dict(partition_counts), dict(owners or {}))
    by_id = {m.id: m for m in members}
    out: dict[str, Assignment] = {m: frozenset() for m in by_id}
    seen: dict[TopicPartition, str] = {}
    for member, parts in dict(result).items():
        if member not in by_id:
            raise AssignorError(f"assignor {assignor.name!r} gave partitions to {member!r}, not a member "
                                f"of the group ({', '.join(sorted(by_id))})", name=assignor.name)
        parts = frozenset((str(t), int(p)) for t, p in parts)
        for tp in sorted(parts):
            topic, p = tp
            if topic not in by_id[member].topics or not 0 <= p < partition_counts.get(topic, 0):
                raise AssignorError(f"assignor {assignor.name!r} gave {topic}/{p} to {member!r}, which is "
                                    f"not a partition of a topic it subscribes to", name=assignor.name)
            if tp in seen:
                raise AssignorError(f"assignor {assignor.name!r} gave {topic}/{p} to both {seen[tp]!r} and "
                                    f"{member!r}", name=assignor.name)
            seen[tp] = member
        out[member] = parts
    for topic in _topics(members):
        missing = [p for p in range(max(0, partition_counts.get(topic, 0))) if (topic, p) not in seen]
        if missing:
            raise AssignorError(f"assignor {assignor.name!r} left {topic}/{missing[0]} "
                                f"{f'and {len(missing) - 1} more ' if len(missing) > 1 else ''}without an owner",
                                name=assignor.name)
    return out
