"""The member state machine, exhaustively, without ZooKeeper."""

from __future__ import annotations

import itertools

import pytest

from raylog.groups.states import Action, Event, MemberState, Step, hands_out, listed, transition
from tests.source_trees import parse

S, E, A = MemberState, Event, Action
ALL_PAIRS = list(itertools.product(MemberState, Event))


@pytest.mark.parametrize("state, event", ALL_PAIRS, ids=[f"{s}-{e}" for s, e in ALL_PAIRS])
def test_every_pair_has_a_defined_step(state, event):
    step = transition(state, event)
    assert isinstance(step, Step)
    assert step.state in MemberState
    assert all(a in Action for a in step.actions)
    if not listed(state, event):
        assert step == Step(state, ())  # unlisted: ignored, never acted upon


@pytest.mark.parametrize("state", [s for s in MemberState if s not in (S.CLOSING, S.CLOSED, S.CREATED)])
def test_close_from_any_started_state_leaves(state):
    assert transition(state, E.CLOSE) == Step(S.CLOSING, (A.LEAVE,))


def test_closed_is_final_and_closing_only_ends_in_closed():
    for event in Event:
        assert transition(S.CLOSED, event) == Step(S.CLOSED)
        assert transition(S.CLOSING, event).state in (S.CLOSING, S.CLOSED)
    assert transition(S.CLOSING, E.LEFT) == Step(S.CLOSED)
    assert transition(S.CREATED, E.CLOSE) == Step(S.CLOSED)


@pytest.mark.parametrize("state", [S.JOINING, S.SETTLING, S.REBALANCING, S.STABLE, S.SUSPENDED])
def test_a_lost_session_forgets_what_it_owned_and_revokes_everything(state):
    step = transition(state, E.SESSION_LOST)
    assert step.state is S.LOST
    assert A.FORGET_OWNED in step.actions and A.REVOKE_ALL in step.actions
    assert step.actions.index(A.FORGET_OWNED) < step.actions.index(A.REVOKE_ALL)
    # it registers again before it takes anything
    assert transition(S.LOST, E.CONNECTED) == Step(S.JOINING, (A.REGISTER,))


@pytest.mark.parametrize("state", [S.SETTLING, S.REBALANCING, S.STABLE])
def test_a_dropped_connection_hides_without_revoking(state):
    step = transition(state, E.DISCONNECTED)
    assert step == Step(S.SUSPENDED, (A.HIDE,))
    assert not hands_out(S.SUSPENDED)
    # back with the same session: a rebalance after the settle period, no new registration
    assert transition(S.SUSPENDED, E.CONNECTED) == Step(S.SETTLING, (A.WAIT_SETTLE,))


@pytest.mark.parametrize("state", [S.STABLE, S.REBALANCING, S.SETTLING])
def test_a_change_waits_for_the_settle_period_and_keeps_handing_out(state):
    step = transition(state, E.CHANGED)
    assert step == Step(S.SETTLING, (A.WAIT_SETTLE,))
    assert hands_out(S.SETTLING)  # partitions that may not move keep flowing


def test_nothing_fails_for_good_steps_are_retried_with_back_off():
    assert transition(S.JOINING, E.FAILED_STEP) == Step(S.JOINING, (A.BACKOFF, A.REGISTER))
    assert transition(S.REBALANCING, E.FAILED_STEP) == Step(S.SETTLING, (A.BACKOFF, A.WAIT_SETTLE))
    assert transition(S.REBALANCING, E.INCOMPLETE) == Step(S.REBALANCING, (A.BACKOFF, A.REBALANCE))
    assert "FAILED" not in MemberState.__members__


def test_only_a_settled_rebalance_rebalances():
    pairs = [(s, e) for s, e in ALL_PAIRS if A.REBALANCE in transition(s, e).actions]
    assert pairs == [(S.SETTLING, E.SETTLED), (S.REBALANCING, E.INCOMPLETE)]


def test_late_outcomes_of_abandoned_steps_are_ignored():
    # e.g. the settle timer or a step's outcome arriving after a disconnection
    for event in (E.SETTLED, E.REBALANCED, E.INCOMPLETE, E.FAILED_STEP, E.JOINED):
        for state in (S.SUSPENDED, S.LOST, S.CLOSING, S.CLOSED):
            assert transition(state, event) == Step(state)


def test_every_state_is_reachable_and_every_started_state_can_close():
    seen, frontier = {S.CREATED}, [S.CREATED]
    while frontier:
        state = frontier.pop()
        for event in Event:
            nxt = transition(state, event).state
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(MemberState)
    for state in MemberState:
        # CLOSED is reachable from everywhere
        reach, frontier = {state}, [state]
        while frontier:
            s = frontier.pop()
            for event in Event:
                n = transition(s, event).state
                if n not in reach:
                    reach.add(n)
                    frontier.append(n)
        assert S.CLOSED in reach


def test_only_live_states_hand_out():
    assert {s for s in MemberState if hands_out(s)} == {S.SETTLING, S.REBALANCING, S.STABLE}


def _state_writes():
    """(file, line, value source) of every assignment to ``self._state`` in
    raylog/groups/, outside ``__init__`` (where the member starts CREATED)."""
    import ast
    from pathlib import Path

    import raylog.groups

    writes = []
    for path in sorted(Path(raylog.groups.__file__).parent.glob("*.py")):
        tree = parse(path.read_text())
        inits = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__init__"
                 for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and id(node) not in inits:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Attribute) and t.attr == "_state":
                            writes.append((path.name, node.lineno, ast.unparse(node.value)))
    return writes


def test_the_members_state_changes_only_through_the_table():
    writes = _state_writes()
    assert writes, "no write of the member's state found: the check no longer sees the member's code"
    # a step of the table: transition(...).state, or step.state where step = transition(...)
    outside = [w for w in writes if not (w[2].startswith("transition(") and w[2].endswith(").state"))
               and w[2] != "step.state"]
    assert outside == [], f"the member's state is written beside the transition table: {outside}"
