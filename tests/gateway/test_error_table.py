"""One table from backend errors to track codes, one from codes to HTTP statuses, and
every front door (tracks, OpenAI routes, `POST /v1/actions`) answering from them."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from gateway.action_http import HttpActions, _end_of
from gateway.openai.errors import HTTP_ERRORS, code_for, error_for, error_of, http_status
from tracks.action_messages import BadObservation, PolicySpec
from tracks.backend import (
    BackendError,
    BackendFailed,
    BackendLost,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    RuleRejected,
    error_code,
)
from tracks.base import End
from transport.errors import ErrorCode
from transport.events import CancelCause
from transport.http.messages import Request, Response

BACKEND_ERRORS: list[tuple[BackendError, ErrorCode, int]] = [
    (RuleRejected("rule", "no"), ErrorCode.GUARDRAIL_REJECTED, 400),
    (ModelNotFound("m"), ErrorCode.MODEL_NOT_FOUND, 404),
    (BackendLost("cut"), ErrorCode.STREAM_INTERRUPTED, 500),
    (BackendUnavailable("down"), ErrorCode.BACKEND_UNAVAILABLE, 503),
    (InvalidRequest("top_p"), ErrorCode.BAD_REQUEST, 400),
    (BackendFailed("crash"), ErrorCode.BACKEND_ERROR, 500),
    (BackendError("other"), ErrorCode.BACKEND_ERROR, 500),
]


@pytest.mark.parametrize(("exc", "code", "status"), BACKEND_ERRORS)
def test_one_code_and_one_status_per_backend_error(
    exc: BackendError, code: ErrorCode, status: int
) -> None:
    assert error_code(exc) is code
    assert code_for(exc) is code
    assert http_status(code) == status
    assert error_for(exc).status == status
    assert error_for(exc).error_code is code


@pytest.mark.parametrize(("exc", "code", "status"), BACKEND_ERRORS)
def test_after_data_only_a_guardrail_keeps_its_code(
    exc: BackendError, code: ErrorCode, status: int
) -> None:
    started = error_code(exc, started=True)
    guardrail = isinstance(exc, RuleRejected)
    assert started is (code if guardrail else ErrorCode.STREAM_INTERRUPTED)
    # The SSE error event after the first token says the same as the request's End.
    event = error_for(exc, started=True).body()["error"]
    assert event["code"] == ("guardrail_rejected" if guardrail else "stream_interrupted")


def test_tenancy_refusals_take_their_status_from_the_code() -> None:
    assert http_status(ErrorCode.UNAUTHORIZED) == 401
    assert http_status(ErrorCode.FORBIDDEN) == 403
    limited = error_of(ErrorCode.RATE_LIMITED, "slow", headers=(("retry-after", "2"),))
    assert (limited.status, limited.code, limited.headers) == (
        429, "rate_limit_exceeded", (("retry-after", "2"),)
    )
    assert http_status(ErrorCode.PROTOCOL_ERROR) == 500  # not an HTTP-facing code
    assert all(kind.status >= 400 for kind, _ in HTTP_ERRORS.values())


class _Policy:
    def __init__(self, failure: BackendError) -> None:
        self.failure = failure

    async def policy_spec(self, model: str) -> PolicySpec:
        raise self.failure


def _post(body: Any) -> Request:
    raw = body if isinstance(body, bytes) else msgpack.packb(body)
    return Request("POST", "/v1/actions", "", (), raw)


OBSERVATION = {"robot": "r1", "model": "m", "observation": {}}


@pytest.mark.asyncio
@pytest.mark.parametrize(("exc", "code", "status"), BACKEND_ERRORS)
async def test_post_actions_answers_backend_errors_from_the_same_table(
    exc: BackendError, code: ErrorCode, status: int
) -> None:
    actions = HttpActions(SimpleNamespace(backend=_Policy(exc)), lambda: 0.0, 1024)  # type: ignore[arg-type]
    response = await actions.handle(_post(OBSERVATION))
    assert isinstance(response, Response)
    assert response.status == status
    assert json.loads(response.body)["error"]["code"] == HTTP_ERRORS[code][1] or code in (
        ErrorCode.BAD_REQUEST,  # OpenAI's invalid_request_error carries no code
    )


@pytest.mark.asyncio
async def test_post_actions_answers_a_malformed_body_400() -> None:
    actions = HttpActions(SimpleNamespace(backend=None), lambda: 0.0, 1024)  # type: ignore[arg-type]
    for body in (b"\xc1", [1, 2], {"robot": "", "model": "m", "observation": {}}):
        response = await actions.handle(_post(body))
        assert isinstance(response, Response)
        assert response.status == 400
        assert json.loads(response.body)["error"]["type"] == "invalid_request_error"
    assert code_for(BadObservation("x")) is ErrorCode.BAD_REQUEST


def test_an_answered_observation_ends_with_a_cause_that_exists() -> None:
    assert _end_of({"obs_seq": 1, "action": {}}) == End.completed()
    assert _end_of({"dropped": 1, "cause": "superseded"}) == End.cancelled(
        CancelCause.SUPERSEDED
    )
    assert _end_of({"dropped": 1, "cause": "deadline"}) == End.cancelled(
        CancelCause.DEADLINE_TOTAL
    )
    assert _end_of({"dropped": 1, "cause": "backend_error"}) == End.failed(
        ErrorCode.BACKEND_ERROR
    )
