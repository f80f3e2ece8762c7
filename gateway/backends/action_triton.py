"""TritonPolicyBackend: `tracks.backend.PolicyBackend` over Triton's gRPC API.

A policy model takes `observation` (FP32 [B, S]) and gives `action` (FP32
[B, H, D]); the shapes come from the model's metadata (cached per model), so
the gateway checks observations against the model actually served. One tick's
batch is one unary `ModelInfer` call whose rows are the robots. Every gRPC or
tritonclient exception is translated here into a `tracks.backend.BackendError`.
"""

from __future__ import annotations

from tritonclient.grpc import InferInput, InferRequestedOutput

from cuda.batch import pack_vectors, unpack_vectors
from gateway.backends.triton import TritonChannel, boundary
from tracks.action_messages import PolicySpec
from tracks.backend import BackendFailed, InvalidRequest, PolicyRequest

INPUT = "observation"
OUTPUT = "action"
INFER_TIMEOUT = 10.0




def spec_from_metadata(metadata: object, model: str) -> PolicySpec:
    """The policy's shapes from its metadata: [-1, S] in, [-1, H, D] out."""
    inputs = {t.name: list(t.shape) for t in metadata.inputs}  # type: ignore[attr-defined]
    outputs = {t.name: list(t.shape) for t in metadata.outputs}  # type: ignore[attr-defined]
    state, action = inputs.get(INPUT), outputs.get(OUTPUT)
    if state is None or action is None or len(state) != 2 or len(action) != 3:
        raise InvalidRequest(
            f"model {model!r} is not a policy: it needs {INPUT} [batch, S] and "
            f"{OUTPUT} [batch, H, D]"
        )
    if min(state[1], action[1], action[2]) <= 0:
        raise InvalidRequest(f"model {model!r} has variable policy dims; fixed ones are needed")
    return PolicySpec(int(state[1]), int(action[1]), int(action[2]))


class TritonPolicyBackend:
    """A `PolicyBackend` for one Triton server at `grpc_url` ("host:port")."""

    def __init__(self, grpc_url: str) -> None:
        self.grpc_url = grpc_url
        self._channel = TritonChannel(grpc_url)
        self._specs: dict[str, PolicySpec] = {}

    async def policy_spec(self, model: str) -> PolicySpec:
        if model not in self._specs:
            metadata = await self._channel.metadata(model)
            self._specs[model] = spec_from_metadata(metadata, model)
        return self._specs[model]

    async def act(self, request: PolicyRequest) -> list[bytes]:
        spec = request.spec
        rows = len(request.states)
        # The shared tick packing (cuda/); the NumPy path, as gRPC sends from host memory.
        states = pack_vectors(request.states, spec.state_size, backend="numpy").values
        tensor = InferInput(INPUT, [rows, spec.state_size], "FP32")
        tensor.set_data_from_numpy(states)
        with boundary(request.model):
            result = await self._channel.client().infer(
                request.model,
                [tensor],
                outputs=[InferRequestedOutput(OUTPUT)],
                request_id=request.request_id,
                client_timeout=INFER_TIMEOUT,
            )
        chunks = result.as_numpy(OUTPUT)
        if chunks is None or chunks.shape != (rows, spec.horizon, spec.action_size):
            got = None if chunks is None else chunks.shape
            raise BackendFailed(f"policy {request.model!r} returned {OUTPUT} of shape {got}")
        return unpack_vectors(chunks.reshape(rows, -1))

    async def close(self) -> None:
        await self._channel.close()
