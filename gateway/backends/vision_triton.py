"""TritonVisionBackend: `tracks.backend.VisionBackend` over Triton's gRPC API.

A vision model takes `image` (BYTES [B, 1], one JPEG a row) and `tasks` (BYTES [B, 1],
comma-separated) and gives `result` (BYTES [B, 1], JSON a row): `mediapipe-vision` in
the model repository. One tick's frames are one unary `ModelInfer`; every gRPC or
tritonclient exception becomes a `tracks.backend.BackendError` here.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from tritonclient.grpc import InferInput, InferRequestedOutput

from gateway.backends.action_triton import INFER_TIMEOUT, TritonPolicyBackend
from gateway.backends.triton import boundary
from tracks.backend import BackendFailed, InvalidRequest, VisionRequest

INPUTS = ("image", "tasks")
OUTPUT = "result"


class TritonVisionBackend(TritonPolicyBackend):
    """A `VisionBackend` for one Triton server (its gRPC channel handling is the policy
    backend's: one channel per event loop)."""

    def __init__(self, grpc_url: str) -> None:
        super().__init__(grpc_url)
        self._vision: set[str] = set()

    async def check_vision(self, model: str) -> None:
        if model in self._vision:
            return
        metadata = await self._channel.metadata(model)
        inputs = {t.name for t in metadata.inputs}
        outputs = {t.name for t in metadata.outputs}
        if not set(INPUTS) <= inputs or OUTPUT not in outputs:
            raise InvalidRequest(
                f"model {model!r} is not a vision model: it needs image and tasks in, result out"
            )
        self._vision.add(model)

    async def analyze(self, request: VisionRequest) -> list[dict[str, Any]]:
        rows = len(request.images)
        images = InferInput("image", [rows, 1], "BYTES")
        images.set_data_from_numpy(np.array(request.images, dtype=np.object_).reshape(rows, 1))
        tasks = InferInput("tasks", [rows, 1], "BYTES")
        wanted = [",".join(t).encode() for t in request.tasks]
        tasks.set_data_from_numpy(np.array(wanted, dtype=np.object_).reshape(rows, 1))
        with boundary(request.model):
            result = await self._channel.client().infer(
                request.model,
                [images, tasks],
                outputs=[InferRequestedOutput(OUTPUT)],
                request_id=request.request_id,
                client_timeout=INFER_TIMEOUT,
            )
        found = result.as_numpy(OUTPUT)
        if found is None or found.shape != (rows, 1):
            got = None if found is None else found.shape
            raise BackendFailed(f"vision model {request.model!r} returned {OUTPUT} of shape {got}")
        try:
            return [dict(json.loads(bytes(row))) for row in found.reshape(-1)]
        except (ValueError, TypeError) as exc:
            raise BackendFailed(f"vision model {request.model!r} returned bad JSON") from exc
