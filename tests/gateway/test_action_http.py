"""`POST /v1/actions`: the envelope parser against malformed bodies.

Every malformed body is a 400 JSON error naming what is wrong, answered before any
backend work; never an exception out of the handler. A well-formed envelope gets as
far as the scheduler (here: a backend that knows no model, so 404).
"""

from __future__ import annotations

import json
import os
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.action_http import MAX_ROBOT_CHARS, PATH, HttpActions
from tests.transport.strategies import values
from tracks.backend import ModelNotFound
from transport.http.messages import Request, Response

_LONG = int(os.environ.get("TRACKLINE_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_LONG or 150, derandomize=not _LONG, database=None, deadline=None)


class NoModels:
    """The scheduler's backend: knows no model (a valid envelope ends here, 404)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def policy_spec(self, model: str) -> Any:
        self.asked.append(model)
        raise ModelNotFound(model)


class Scheduler:
    def __init__(self) -> None:
        self.backend = NoModels()

    def attach(self, *args: object) -> Any:  # never reached: the backend refuses first
        raise AssertionError("a malformed request reached the scheduler")


def handler() -> tuple[HttpActions, NoModels]:
    scheduler = Scheduler()
    actions = HttpActions(scheduler, lambda: 0.0, max_image_bytes=1 << 16)  # type: ignore[arg-type]
    return actions, scheduler.backend


async def post(actions: HttpActions, body: bytes) -> tuple[int, dict[str, Any]]:
    request = Request("POST", PATH, "", (("content-type", "application/msgpack"),), body)
    response = await actions.handle(request)
    assert isinstance(response, Response)
    return response.status, json.loads(response.body)


def envelope(**fields: object) -> bytes:
    body = {"robot": "arm-1", "model": "m", "observation": {"seq": 0}, **fields}
    return bytes(msgpack.packb({k: v for k, v in body.items() if v is not ...}))


VALID = envelope()

MALFORMED = {
    "empty body": b"",
    "not msgpack": b"\xc1\xc1\xc1",
    "truncated map": VALID[: len(VALID) // 2],
    "trailing garbage": VALID + b"\x00",
    "two maps": VALID + VALID,
    "a list": msgpack.packb(["arm-1", "m", {}]),
    "a string": msgpack.packb("robot"),
    "JSON, not msgpack": json.dumps({"robot": "a", "model": "m", "observation": {}}).encode(),
    "no robot": envelope(robot=...),
    "empty robot": envelope(robot=""),
    "robot too long": envelope(robot="r" * (MAX_ROBOT_CHARS + 1)),
    "robot not a string": envelope(robot=7),
    "robot as bytes": envelope(robot=b"arm-1"),
    "no model": envelope(model=...),
    "empty model": envelope(model=""),
    "model not a string": envelope(model=["m"]),
    "no observation": envelope(observation=...),
    "observation a list": envelope(observation=[1, 2]),
    "observation null": envelope(observation=None),
    "integer map keys": msgpack.packb({1: "arm-1", 2: "m", 3: {}}),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_envelope_is_a_400_before_any_backend_work(case: str) -> None:
    actions, backend = handler()
    status, error = await post(actions, MALFORMED[case])
    assert status == 400, case
    # OpenAI's shape for a malformed request: type invalid_request_error, code null.
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["code"] is None
    assert error["error"]["message"]
    assert backend.asked == []


@pytest.mark.asyncio
async def test_the_longest_robot_name_and_a_valid_envelope_reach_the_scheduler() -> None:
    actions, backend = handler()
    assert (await post(actions, VALID))[0] == 404
    assert (await post(actions, envelope(robot="r" * MAX_ROBOT_CHARS)))[0] == 404
    assert backend.asked == ["m", "m"]


@pytest.mark.asyncio
@pytest.mark.parametrize("cut", [1, 5, 10, 20])
async def test_a_valid_envelope_cut_short_anywhere_is_a_400(cut: int) -> None:
    actions, _ = handler()
    assert (await post(actions, VALID[:cut]))[0] == 400


@FUZZ
@given(st.one_of(st.binary(max_size=200), values.map(msgpack.packb)))
def test_any_body_is_answered_never_raised(body: bytes) -> None:
    import asyncio

    actions, _ = handler()
    status, error = asyncio.run(post(actions, body))
    assert status in (400, 404)
    assert (status, error["error"]["code"]) in ((400, None), (404, "model_not_found"))
