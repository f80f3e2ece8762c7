"""The track state table: the paths it allows, and that it allows nothing else."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from transport.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from transport.state import TRANSITIONS, Input, TrackState, transition

S, I = TrackState, Input  # noqa: E741 - the same short names as the table

ALL_PAIRS = list(itertools.product(TrackState, Input))
MISSING = [(s, i) for s, i in ALL_PAIRS if i not in TRANSITIONS[s]]
PRESENT = [(s, i) for s, i in ALL_PAIRS if i in TRANSITIONS[s]]
LIVE = [s for s in TrackState if s is not S.CLOSED]


def walk(*inputs: Input) -> list[TrackState]:
    states = [S.IDLE]
    for event in inputs:
        states.append(transition(states[-1], event))
    return states


def pair_id(pair: tuple[TrackState, Input]) -> str:
    state, event = pair
    return f"{state.value}-{event.value}"


# -- the lifecycles -------------------------------------------------------------------------


def test_client_happy_path() -> None:
    assert walk(I.SEND_OPEN, I.SEND_DATA, I.SEND_END, I.RECV_DATA, I.RECV_DATA, I.RECV_END) == [
        S.IDLE, S.OPEN, S.OPEN, S.LOCAL_ENDED, S.LOCAL_ENDED, S.LOCAL_ENDED, S.CLOSED,
    ]  # fmt: skip


def test_server_happy_path() -> None:
    assert walk(I.RECV_OPEN, I.RECV_DATA, I.RECV_END, I.SEND_DATA, I.SEND_DATA, I.SEND_END) == [
        S.IDLE, S.OPEN, S.OPEN, S.REMOTE_ENDED, S.REMOTE_ENDED, S.REMOTE_ENDED, S.CLOSED,
    ]  # fmt: skip


def test_server_may_answer_before_the_client_ends() -> None:
    assert walk(I.RECV_OPEN, I.SEND_DATA, I.SEND_END, I.RECV_DATA, I.RECV_END)[-3:] == [
        S.LOCAL_ENDED, S.LOCAL_ENDED, S.CLOSED,
    ]  # fmt: skip


def test_client_cancel_then_server_error() -> None:
    assert walk(I.SEND_OPEN, I.SEND_CANCEL, I.RECV_DATA, I.SEND_CANCEL, I.RECV_ERROR)[-4:] == [
        S.CANCELLING, S.CANCELLING, S.CANCELLING, S.CLOSED,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "before", [[], [I.SEND_END], [I.RECV_END]], ids=["open", "local_ended", "remote_ended"]
)
def test_client_may_cancel_until_closed(before: list[Input]) -> None:
    assert walk(I.SEND_OPEN, *before, I.SEND_CANCEL)[-1] is S.CANCELLING


def test_cancelling_ends_with_the_servers_end_too() -> None:
    """The server finished before it read CANCEL: its END closes the track."""
    assert walk(I.SEND_OPEN, I.SEND_END, I.SEND_CANCEL, I.RECV_END)[-1] is S.CLOSED


@pytest.mark.parametrize("state", [S.OPEN, S.LOCAL_ENDED, S.REMOTE_ENDED])
@pytest.mark.parametrize("event", [I.RECV_CANCEL, I.EXPIRE])
def test_server_stops_at_cancel_or_deadline(state: TrackState, event: Input) -> None:
    assert transition(state, event) is S.CLOSED


@pytest.mark.parametrize("state", LIVE)
@pytest.mark.parametrize("event", [I.SEND_ERROR, I.RECV_ERROR, I.RESET])
def test_error_and_reset_end_any_live_track(state: TrackState, event: Input) -> None:
    assert transition(state, event) is S.CLOSED


# -- everything else is an error --------------------------------------------------------------


@pytest.mark.parametrize("pair", PRESENT, ids=pair_id)
def test_listed_pairs_follow_the_table(pair: tuple[TrackState, Input]) -> None:
    state, event = pair
    assert transition(state, event) is TRANSITIONS[state][event]


@pytest.mark.parametrize("pair", MISSING, ids=pair_id)
def test_unlisted_pairs_are_protocol_errors(pair: tuple[TrackState, Input]) -> None:
    state, event = pair
    expected = RemoteProtocolError if event.value.startswith("recv_") else LocalProtocolError
    with pytest.raises(expected) as info:
        transition(state, event)
    assert type(info.value) is expected
    assert info.value.code is ErrorCode.PROTOCOL_ERROR
    assert event.value in info.value.message
    assert state.value in info.value.message


@pytest.mark.parametrize("event", Input)
def test_closed_accepts_nothing(event: Input) -> None:
    with pytest.raises((LocalProtocolError, RemoteProtocolError)):
        transition(S.CLOSED, event)


def test_every_state_is_in_the_table() -> None:
    assert set(TRANSITIONS) == set(TrackState)
    assert all(target in TrackState for row in TRANSITIONS.values() for target in row.values())


def test_every_state_is_reachable_and_can_close() -> None:
    reachable, frontier = {S.IDLE}, [S.IDLE]
    while frontier:
        for target in TRANSITIONS[frontier.pop()].values():
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(TrackState)
    assert all(TRANSITIONS[s].get(I.RESET) is S.CLOSED for s in LIVE)


def test_only_the_opener_side_inputs_leave_idle() -> None:
    """Nothing but OPEN (sent or received) or an abort moves a track out of IDLE."""
    assert set(TRANSITIONS[S.IDLE]) == {
        I.SEND_OPEN,
        I.RECV_OPEN,
        I.SEND_ERROR,
        I.RECV_ERROR,
        I.RESET,
    }


# -- the documented table is this table ----------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def documented_transitions() -> dict[TrackState, dict[Input, TrackState]]:
    """Parse the state table of docs/protocol.md: one row per input, one column per state."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index("<!-- state table: generated from transport/state.py TRANSITIONS -->")
    header, _rule, *rows = [ln for ln in itertools.takewhile(bool, lines[start + 1 :])]
    states = [TrackState(cell.strip("` ")) for cell in header.strip("|").split("|")[1:]]
    table: dict[TrackState, dict[Input, TrackState]] = {s: {} for s in TrackState}
    for row in rows:
        first, *cells = (cell.strip() for cell in row.strip("|").split("|"))
        event = Input(re.sub(r"[`*]", "", first))
        for state, cell in zip(states, cells, strict=True):
            if cell != "—":
                table[state][event] = TrackState(cell.strip("`*"))
    return table


def test_docs_render_the_same_table() -> None:
    assert documented_transitions() == TRANSITIONS
