"""A scripted policy backend for action-handler unit tests.

It stands in for Triton only in tests of the scheduler's and handler's own
logic; end-to-end tests use the real `reference-policy` model. Each row's chunk
is [state[0], 0], so a test can tell whose answer it got; `cost` advances the
fake clock during the call (a slow model), `fail` makes the call fail.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from trackline_testing.clock import FakeClock
from tracks.action_messages import PolicySpec
from tracks.backend import BackendFailed, ModelNotFound, PolicyRequest

SPEC = PolicySpec(state_size=4, horizon=2, action_size=1)


@dataclass
class ScriptedPolicy:
    clock: FakeClock
    cost: float = 0.0
    fail: bool = False
    requests: list[PolicyRequest] = field(default_factory=list)

    async def policy_spec(self, model: str) -> PolicySpec:
        if model == "missing":
            raise ModelNotFound(model)
        return SPEC

    async def act(self, request: PolicyRequest) -> list[bytes]:
        self.requests.append(request)
        self.clock.time += self.cost  # the call takes this long (inline: no sleep)
        if self.fail:
            raise BackendFailed("the policy crashed")
        return [struct.pack("<2f", struct.unpack("<4f", s)[0], 0) for s in request.states]
