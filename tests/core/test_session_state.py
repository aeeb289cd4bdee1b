"""The session's life as one state enum with one transition function (no sleeps, no server)."""

from __future__ import annotations

import pytest

from tether.core.session import SessionState, next_state

OPEN, DRAINING, CLOSED = SessionState.OPEN, SessionState.DRAINING, SessionState.CLOSED


@pytest.mark.parametrize("path", [(OPEN, DRAINING, CLOSED), (OPEN, CLOSED), (OPEN, CLOSED, CLOSED)])
def test_the_ways_a_session_ends(path: tuple[SessionState, ...]) -> None:
    state = path[0]
    for wanted in path[1:]:
        state = next_state(state, wanted)
    assert state is path[-1]


@pytest.mark.parametrize(
    ("current", "wanted"),
    [(DRAINING, OPEN), (CLOSED, OPEN), (CLOSED, DRAINING), (DRAINING, DRAINING), (OPEN, OPEN)],
)
def test_no_way_back(current: SessionState, wanted: SessionState) -> None:
    with pytest.raises(ValueError, match=f"from {current.value} to {wanted.value}"):
        next_state(current, wanted)
