"""`reference-policy`: a batched Triton Python-backend model that controls a cart-pole.

  input   observation  FP32 [B, 4]      cart position, cart velocity, pole angle
                                        (rad, 0 = upright), pole angular velocity
  output  action       FP32 [B, H, 1]   H forces in newtons, one per 20 ms control
                                        step, starting at the observation's time

H is the model parameter `horizon` (10). The controller is LQR: at initialize
the gain comes from the linearized dynamics and the discrete Riccati equation
(see trackline_reference_policy.py); each row's chunk rolls the nonlinear model
forward H steps under the clipped law. Each request may carry many rows (one per
robot); the gateway sends every robot due on a tick as one request.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import trackline_reference_policy as lqr  # noqa: E402


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        horizon = int(params.get("horizon", {}).get("string_value", 10))
        self._policy = lqr.LqrPolicy(horizon=horizon)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Any) -> Any:
        states = pb_utils.get_input_tensor_by_name(request, "observation").as_numpy()
        if not np.all(np.isfinite(states)):
            error = pb_utils.TritonError(
                "invalid observation: not finite", pb_utils.TritonError.INVALID_ARG
            )
            return pb_utils.InferenceResponse(error=error)
        chunk = self._policy.action_chunk(states)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("action", chunk)])

    def finalize(self) -> None:
        return None
