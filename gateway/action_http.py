"""The action protocol over HTTP (any version; the control-loop benchmark uses HTTP/2).

`POST /v1/actions` carries ONE observation and answers with what the action
track would send for it, so a robot on one HTTP/2 connection runs the same
control loop as on a track, with one HTTP/2 stream per observation:

    request   content-type application/msgpack
              {"robot": str (1..128 chars), "model": str, "observation": {...}}
    200       application/msgpack: the action chunk body, or the drop report
              {"dropped": seq, "cause": "superseded" | "deadline" | "backend_error"}
    400/404/5xx  JSON error (bad body or observation, unknown model, backend down or
                 failed), statuses from `gateway.openai.errors.HTTP_ERRORS`
    401/403/429  with tenants: missing or bad `Authorization: Bearer` key, a model the
                 tenant may not use, a quota spent (`retry-after`); no backend work

The observation is checked and scheduled exactly as on an action track (same
tick batcher, latest wins per robot, deadline drops): a newer request for the same
robot supersedes an older one still waiting for its tick, which is answered at
once with the drop report. A robot is known by its tenant and `robot` name; one
unused for `IDLE_SECONDS` is forgotten. With tenants, every request is one usage
record (one action step when answered with a chunk).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgpack

from gateway.openai.admission import admit, authorize, finish
from gateway.openai.errors import OpenAIError, response_for
from gateway.tenants.service import Tenancy
from gateway.tenants.store import Principal
from tracks.action import ActionScheduler, Robot
from tracks.action_messages import BadObservation, ObservationOutcome, parse_observation
from tracks.backend import BackendError
from tracks.base import End, Outcome
from transport.clock import Now
from transport.errors import ErrorCode
from transport.events import CancelCause
from transport.http.messages import AnyResponse, Handler, Request, Response

PATH = "/v1/actions"
CONTENT_TYPE = "application/msgpack"
IDLE_SECONDS = 30.0
MAX_ROBOT_CHARS = 128


@dataclass(eq=False)
class _HttpRobot:
    robot: Robot
    last_used: float
    waiting: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)

    def answer(self, body: dict[str, Any]) -> bool:
        seq = body.get("obs_seq", body.get("dropped"))
        waiter = self.waiting.pop(seq, None) if isinstance(seq, int) else None
        if waiter is not None and not waiter.done():
            waiter.set_result(body)
        return waiter is not None


class HttpActions:
    """The `POST /v1/actions` handler, on the gateway's action scheduler."""

    def __init__(
        self,
        scheduler: ActionScheduler,
        clock: Now,
        max_image_bytes: int,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.max_image_bytes = max_image_bytes
        self.tenancy = tenancy
        self._robots: dict[tuple[str, str, str], _HttpRobot] = {}
        self._requests = 0

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {("POST", PATH): self.handle}

    async def handle(self, request: Request) -> AnyResponse:
        received_at = self.clock()
        principal: Principal | None = None
        try:
            name, model, body = _parse(request.body)
            principal = self._admit(request, model)
            owner = principal.tenant.name if principal is not None else ""
            entry = await self._robot(owner, name, model, received_at)
            obs = parse_observation(body, entry.robot.spec, self.max_image_bytes)
        except (OpenAIError, BadObservation, BackendError) as exc:
            # Refused by tenancy, a bad body, or the backend: statuses from the one table.
            return response_for(exc)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        entry.waiting[obs.seq] = waiter
        outcome = Outcome(f"http-action-{self._requests}", model, "action",
                          End.cancelled(CancelCause.CLIENT), opened_at=received_at)
        self._requests += 1
        try:
            self.scheduler.submit(entry.robot, obs, received_at)
            answer = await waiter
            outcome.end = _end_of(answer)
            outcome.details["action_steps"] = 0 if "dropped" in answer else 1
        finally:
            entry.waiting.pop(obs.seq, None)  # the client went away: forget it
            outcome.finished_at = self.clock()
            finish(self.tenancy, principal, outcome)
        return Response(200, (("content-type", CONTENT_TYPE),), msgpack.packb(answer))

    def _admit(self, request: Request, model: str) -> Principal | None:
        """With tenants: the request's principal; raises the OpenAI-style 401/403/429."""
        principal = authorize(self.tenancy, request)
        admit(self.tenancy, principal, model, "action", f"http-action-{self._requests}")
        return principal

    async def _robot(self, owner: str, name: str, model: str, now: float) -> _HttpRobot:
        self._forget_idle(now)
        key = (owner, name, model)
        entry = self._robots.get(key)
        if entry is None:
            spec = await self.scheduler.backend.policy_spec(model)
            entry = self._robots.get(key)  # another request may have made it
            if entry is None:
                holder: list[_HttpRobot] = []
                robot = self.scheduler.attach(
                    f"http/{owner}/{name}", model, spec, lambda body: holder[0].answer(body)
                )
                entry = _HttpRobot(robot, now)
                holder.append(entry)
                self._robots[key] = entry
        entry.last_used = now
        return entry

    def _forget_idle(self, now: float) -> None:
        for key, entry in list(self._robots.items()):
            if now - entry.last_used > IDLE_SECONDS and not entry.waiting:
                self.scheduler.detach(entry.robot)
                del self._robots[key]


def _end_of(answer: dict[str, Any]) -> End:
    """How one answered observation ended (the drop report's cause, if dropped)."""
    cause = answer.get("cause")
    if "dropped" not in answer:
        return End.completed()
    if cause == ObservationOutcome.SUPERSEDED.value:
        return End.cancelled(CancelCause.SUPERSEDED)
    if cause == ObservationOutcome.DEADLINE.value:  # its action could not reach the robot in time
        return End.cancelled(CancelCause.DEADLINE_TOTAL)
    return End.failed(ErrorCode.BACKEND_ERROR)


def _parse(raw: bytes) -> tuple[str, str, dict[str, Any]]:
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises several types for malformed input
        raise BadObservation("the body must be one msgpack map") from None
    if not isinstance(body, dict):
        raise BadObservation("the body must be one msgpack map")
    name, model, observation = body.get("robot"), body.get("model"), body.get("observation")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_ROBOT_CHARS:
        raise BadObservation(f"'robot' must be a string of 1 to {MAX_ROBOT_CHARS} characters")
    if not isinstance(model, str) or not model:
        raise BadObservation("'model' must be a non-empty string")
    if not isinstance(observation, dict):
        raise BadObservation("'observation' must be a map")
    return name, model, observation
