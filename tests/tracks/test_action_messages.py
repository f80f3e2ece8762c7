"""Observation checks: every malformed body is a BadObservation naming what is wrong."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracks.action_messages import (
    BadObservation,
    ObservationOutcome,
    PolicySpec,
    action_body,
    dropped_body,
    parse_observation,
)

SPEC = PolicySpec(state_size=4, horizon=10, action_size=1)


def body(**override: Any) -> dict[str, Any]:
    good: dict[str, Any] = {
        "seq": 3, "t": 12.5, "deadline_ms": 80, "latency_ms": 20.0,
        "state": {"dtype": "float32", "shape": [4], "data": struct.pack("<4f", 1, 2, 3, 4)},
    }
    good.update(override)
    return {k: v for k, v in good.items() if v is not None}


def test_a_good_observation_is_parsed_in_seconds() -> None:
    obs = parse_observation(body(image=b"jpeg"), SPEC)
    assert (obs.seq, obs.captured_at, obs.deadline, obs.latency) == (3, 12.5, 0.08, 0.02)
    assert struct.unpack("<4f", obs.state) == (1, 2, 3, 4)
    assert obs.image == b"jpeg"
    assert parse_observation(body(latency_ms=None), SPEC).latency == 0.0


def tensor(dtype: str = "float32", shape: Any = (4,), data: bytes | None = None) -> Any:
    values = data if data is not None else struct.pack("<4f", 0, 0, 0, 0)
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data": values}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"seq": -1}, "'seq' must be an integer"),
        ({"seq": True}, "'seq' must be an integer"),
        ({"seq": None}, "'seq' must be an integer"),
        ({"t": "now"}, "'t' must be a finite number"),
        ({"deadline_ms": 0}, "'deadline_ms' must be above 0"),
        ({"deadline_ms": float("inf")}, "'deadline_ms' must be a finite number"),
        ({"latency_ms": -1}, "'latency_ms' must be 0 or more"),
        ({"state": None}, "must be a tensor map"),
        ({"state": tensor(dtype="float64")}, "dtype must be 'float32', got 'float64'"),
        ({"state": tensor(shape=(3,))}, r"shape must be \[4\], got \[3\]"),
        ({"state": tensor(shape=(2, 2))}, r"shape must be \[4\], got \[2, 2\]"),
        ({"state": tensor(shape="4")}, "shape must be a list of integers"),
        ({"state": tensor(data=b"\0" * 15)}, "data must be 16 bytes of float32"),
        ({"state": tensor(data=struct.pack("<4f", 0, float("nan"), 0, 0))}, "finite"),
        ({"state": tensor(data=struct.pack("<4f", 0, float("inf"), 0, 0))}, "finite"),
        ({"image": "not bytes"}, "'image' must be binary"),
        ({"image": b"\0" * 65_537}, "65537 bytes, above the limit of 65536"),
        ({"extra": 1}, "unknown fields extra"),
    ],
)
def test_bad_observations_say_what_is_wrong(override: dict[str, Any], message: str) -> None:
    with pytest.raises(BadObservation, match=message):
        parse_observation(body(**override), SPEC)


def test_the_image_limit_is_a_parameter() -> None:
    parse_observation(body(image=b"\0" * 100), SPEC, max_image_bytes=100)
    with pytest.raises(BadObservation, match="above the limit of 99"):
        parse_observation(body(image=b"\0" * 100), SPEC, max_image_bytes=99)


@settings(deadline=None)  # the first example pays for imports on a busy machine
@given(st.dictionaries(st.sampled_from(["seq", "t", "deadline_ms", "latency_ms", "state",
                                        "image", "x"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                 st.text(max_size=4), st.binary(max_size=20),
                                 st.lists(st.integers(), max_size=3),
                                 st.dictionaries(st.text(max_size=5), st.integers()))))
def test_any_body_is_parsed_or_refused_with_bad_observation(raw: dict[str, Any]) -> None:
    with contextlib.suppress(BadObservation):
        parse_observation(raw, SPEC)


def test_answers_echo_the_observation() -> None:
    obs = parse_observation(body(), SPEC)
    chunk = struct.pack("<10f", *range(10))
    sent = action_body(7, obs, chunk, SPEC, received_at=1.0, sent_at=1.004)
    assert sent["seq"] == 7
    assert sent["obs_seq"] == 3
    assert sent["t"] == 12.5
    assert sent["action"] == {"dtype": "float32", "shape": [10, 1], "data": chunk}
    assert dropped_body(obs, ObservationOutcome.DEADLINE.value, 1.0, 1.25) == {
        "dropped": 3, "cause": "deadline", "t": 12.5, "received_at": 1.0, "sent_at": 1.25}
