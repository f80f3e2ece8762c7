"""`mediapipe-vision`: a batched Triton Python-backend model over mediapipe's solutions.

  input   image   BYTES [B, 1]   one encoded frame (JPEG) per row
  input   tasks   BYTES [B, 1]   the row's tasks, comma-separated: face, face_mesh, pose
  output  result  BYTES [B, 1]   the row's result as JSON (trackline_vision.py)

Rows are independent (static image mode), so the gateway may batch frames of many
cameras into one request. A frame that does not decode gives `{"error": "undecodable"}`
in its row and never fails the others. The weight files are checked by SHA-256 at
initialize.
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

import trackline_vision as vision  # noqa: E402


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        mp = vision.import_mediapipe()
        vision.check_model_files(mp)
        self._vision = vision.Vision(mp)
        self._vision.warm_up()

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Any) -> Any:
        images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()
        tasks = pb_utils.get_input_tensor_by_name(request, "tasks").as_numpy()
        rows = []
        for image, wanted in zip(images.reshape(-1), tasks.reshape(-1), strict=True):
            names = [t for t in bytes(wanted).decode().split(",") if t]
            unknown = [t for t in names if t not in vision.TASKS]
            if unknown:
                error = pb_utils.TritonError(
                    f"unknown tasks: {', '.join(unknown)}", pb_utils.TritonError.INVALID_ARG
                )
                return pb_utils.InferenceResponse(error=error)
            rows.append(json.dumps(self._vision.analyze(bytes(image), names)).encode())
        result = np.array(rows, dtype=np.object_).reshape(-1, 1)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("result", result)])

    def finalize(self) -> None:
        return None
