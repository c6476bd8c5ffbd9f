"""The group member's state machine: an explicit transition function over events.

:func:`transition` is pure (no ZooKeeper, no threads, no clock): given the
member's state and an event it returns the next state and the actions the
member's thread must perform, in order. :class:`raylog.groups.member.GroupMember`
feeds it the events its watches, its connection listener and its own steps
produce, and carries out the actions with :mod:`raylog.groups.ownership`.

States
------

``CREATED``      not started.
``JOINING``      creating the ephemeral ``ids/<consumer id>`` node.
``SETTLING``     membership or partitions changed: waiting for the settle
                 period to pass without a further change before rebalancing
                 (a storm of joins costs one rebalance, not one per join).
                 Partitions handed out stay handed out and keep flowing.
``REBALANCING``  one cooperative step: read members and partition counts,
                 revoke (commit, then release) only the partitions that move
                 away, claim only the ones that move here. Partitions that
                 do not move are never revoked.
``STABLE``       holding the whole assignment of the last read.
``SUSPENDED``    the ZooKeeper connection dropped; the session may still be
                 alive. Nothing is handed out until it reconnects (the owner
                 nodes may expire meanwhile), but nothing is forgotten either.
``LOST``         the session expired: every ephemeral node of the member is
                 gone, so it forgets what it owned and revokes everything.
``CLOSING``      leaving: revoke everything, release the owner nodes, delete
                 the ids node.
``CLOSED``       final.

There is no FAILED state: a step that ZooKeeper interrupts, or a claim that a
slow peer blocks, is retried with jittered back-off for as long as the member
lives; only :meth:`~raylog.groups.member.GroupMember.close` ends a member.

Events
------

``START``        the application started the member.
``JOINED``       the ids node exists (created by this session).
``CHANGED``      a watch saw the members or a subscribed topic change.
``SETTLED``      the settle period passed without a change.
``REBALANCED``   a rebalance step ended holding the whole target.
``INCOMPLETE``   a rebalance step ended with claims still blocked by a
                 previous owner (it is retried after a jittered pause, or at
                 once when that owner node goes away).
``FAILED_STEP``  ZooKeeper interrupted a step (retried after a jittered pause).
``DISCONNECTED`` the connection dropped (kazoo's SUSPENDED).
``SESSION_LOST`` the session expired (kazoo's LOST).
``CONNECTED``    connected again (same or new session).
``CLOSE``        the application closes the member.
``LEFT``         leaving is done.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class _Named(str, enum.Enum):
    """An enum whose members print as their names."""

    def __str__(self) -> str:
        return self.value


class MemberState(_Named):
    CREATED = "CREATED"
    JOINING = "JOINING"
    SETTLING = "SETTLING"
    REBALANCING = "REBALANCING"
    STABLE = "STABLE"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"


class Event(_Named):
    START = "START"
    JOINED = "JOINED"
    CHANGED = "CHANGED"
    SETTLED = "SETTLED"
    REBALANCED = "REBALANCED"
    INCOMPLETE = "INCOMPLETE"
    FAILED_STEP = "FAILED_STEP"
    DISCONNECTED = "DISCONNECTED"
    SESSION_LOST = "SESSION_LOST"
    CONNECTED = "CONNECTED"
    CLOSE = "CLOSE"
    LEFT = "LEFT"


class Action(_Named):
    REGISTER = "REGISTER"            # create the ids node (adopt it if this session made it)
    WAIT_SETTLE = "WAIT_SETTLE"      # (re)start the settle timer; SETTLED when it runs out
    REBALANCE = "REBALANCE"          # one cooperative step; REBALANCED, INCOMPLETE or FAILED_STEP
    BACKOFF = "BACKOFF"              # a jittered pause before the step is retried
    HIDE = "HIDE"                    # hand out nothing until the next rebalance
    FORGET_OWNED = "FORGET_OWNED"    # the session's owner nodes are gone: drop them from memory
    REVOKE_ALL = "REVOKE_ALL"        # on_revoked for everything handed out
    LEAVE = "LEAVE"                  # revoke all, release own owner nodes, delete the ids node; then LEFT


class Step(NamedTuple):
    state: MemberState
    actions: tuple[Action, ...] = ()


S, E, A = MemberState, Event, Action

#: states in which the member is connected and registered
_LIVE = (S.SETTLING, S.REBALANCING, S.STABLE)

_TABLE: dict[tuple[MemberState, Event], Step] = {
    (S.CREATED, E.START): Step(S.JOINING, (A.REGISTER,)),

    (S.JOINING, E.JOINED): Step(S.SETTLING, (A.WAIT_SETTLE,)),
    (S.JOINING, E.FAILED_STEP): Step(S.JOINING, (A.BACKOFF, A.REGISTER)),
    (S.JOINING, E.CHANGED): Step(S.JOINING),  # the first rebalance reads afresh anyway

    (S.SETTLING, E.CHANGED): Step(S.SETTLING, (A.WAIT_SETTLE,)),
    (S.SETTLING, E.SETTLED): Step(S.REBALANCING, (A.REBALANCE,)),

    (S.REBALANCING, E.REBALANCED): Step(S.STABLE),
    (S.REBALANCING, E.INCOMPLETE): Step(S.REBALANCING, (A.BACKOFF, A.REBALANCE)),
    (S.REBALANCING, E.FAILED_STEP): Step(S.SETTLING, (A.BACKOFF, A.WAIT_SETTLE)),
    (S.REBALANCING, E.CHANGED): Step(S.SETTLING, (A.WAIT_SETTLE,)),

    (S.STABLE, E.CHANGED): Step(S.SETTLING, (A.WAIT_SETTLE,)),

    (S.SUSPENDED, E.CONNECTED): Step(S.SETTLING, (A.WAIT_SETTLE,)),
    (S.LOST, E.CONNECTED): Step(S.JOINING, (A.REGISTER,)),

    (S.CLOSING, E.LEFT): Step(S.CLOSED),
}

# Connection changes, the same from every started state.
for _state in (S.JOINING, *_LIVE):
    _TABLE[(_state, E.DISCONNECTED)] = Step(S.SUSPENDED, (A.HIDE,))
for _state in (S.JOINING, *_LIVE, S.SUSPENDED):
    _TABLE[(_state, E.SESSION_LOST)] = Step(S.LOST, (A.HIDE, A.FORGET_OWNED, A.REVOKE_ALL))
_TABLE[(S.LOST, E.SESSION_LOST)] = Step(S.LOST)
_TABLE[(S.SUSPENDED, E.DISCONNECTED)] = Step(S.SUSPENDED)
_TABLE[(S.LOST, E.DISCONNECTED)] = Step(S.LOST)
for _state in (S.JOINING, *_LIVE):
    _TABLE[(_state, E.CONNECTED)] = Step(_state)  # a duplicate notice: nothing changed
# Closing, from every state that is not closing already.
_TABLE[(S.CREATED, E.CLOSE)] = Step(S.CLOSED)
for _state in (S.JOINING, *_LIVE, S.SUSPENDED, S.LOST):
    _TABLE[(_state, E.CLOSE)] = Step(S.CLOSING, (A.LEAVE,))
del _state


def transition(state: MemberState, event: Event) -> Step:
    """The next state and the actions to perform for ``event`` in ``state``.

    A pair the table does not list leaves the state as it is and does
    nothing: a late notice of a step that no longer matters (say SETTLED
    after a disconnection) is ignored, never acted upon.
    """
    return _TABLE.get((state, event), Step(state))


def listed(state: MemberState, event: Event) -> bool:
    """Whether ``(state, event)`` is an explicit entry of the table."""
    return (state, event) in _TABLE


def hands_out(state: MemberState) -> bool:
    """Whether a member in ``state`` may hand out what it holds."""
    return state in _LIVE
