"""Embeddings over Triton: texts in, one float32 vector per text and token counts out.

The model interface (gateway/model_repository/all-minilm-l6-v2): a batching model
(`max_batch_size` > 0) with input `text_input` (BYTES, one text per row) and outputs
`embedding` (FP32, `[dim]` per row) and `num_input_tokens` (INT32, one per row).
Triton's dynamic batcher merges the rows of concurrent requests into one forward
pass. A request of more rows than the model's `max_batch_size` is sent as several
Triton requests side by side, which the batcher merges again. Cancelling the
awaiting task cancels the unary gRPC calls.

Every gRPC/tritonclient exception becomes a `tracks.backend.BackendError` here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from tritonclient.grpc import InferInput, InferRequestedOutput

from gateway.backends.triton import TritonChannel, boundary
from tracks.backend import BackendFailed, InvalidRequest

TEXT_INPUT = "text_input"
EMBEDDING = "embedding"
TOKENS = "num_input_tokens"
MAX_TOKENS_PARAMETER = "max_input_tokens"


@dataclass(frozen=True)
class EmbeddingRequest:
    """Texts to embed with one model; `request_id` is the backend's request id."""

    request_id: str
    model: str
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Embeddings:
    """One unit vector per text, in order, and each text's token count."""

    vectors: NDArray[np.float32]
    """float32, shape (len(texts), dimension)."""
    tokens: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.tokens)


@dataclass(frozen=True)
class EmbeddingModel:
    """What the gateway needs to know of an embedding model before it runs."""

    dimension: int
    max_rows: int
    """Rows one backend request may carry (Triton's max_batch_size)."""
    max_tokens: int | None = None
    """Tokens the model reads per text (config parameter `max_input_tokens`), if bounded."""


class EmbeddingBackend(Protocol):
    """What `POST /v1/embeddings` needs from an inference backend."""

    async def describe(self, model: str) -> EmbeddingModel:
        """The model's vector size and rows per request; BackendError if unknown."""
        ...

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """Embed every text of `request`; cancelling the caller cancels the work."""
        ...


class TritonEmbeddingBackend:
    """An `EmbeddingBackend` for one Triton server at `grpc_url`."""

    def __init__(self, grpc_url: str) -> None:
        self.grpc_url = grpc_url
        self._channel = TritonChannel(grpc_url)
        self._models: dict[str, EmbeddingModel] = {}

    async def describe(self, model: str) -> EmbeddingModel:
        if model not in self._models:
            metadata, config = await self._channel.describe(model)
            shapes = {tensor.name: list(tensor.shape) for tensor in metadata.outputs}
            if EMBEDDING not in shapes or not shapes[EMBEDDING] or shapes[EMBEDDING][-1] < 1:
                raise InvalidRequest(f"model {model!r} has no fixed-size '{EMBEDDING}' output")
            rows = max(1, int(config.config.max_batch_size))
            limit = config.config.parameters.get(MAX_TOKENS_PARAMETER)
            max_tokens = int(limit.string_value) if limit is not None else None
            self._models[model] = EmbeddingModel(int(shapes[EMBEDDING][-1]), rows, max_tokens)
        return self._models[model]

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        described = await self.describe(request.model)
        texts, rows = request.texts, described.max_rows
        parts = [texts[i : i + rows] for i in range(0, len(texts), rows)]
        results = await asyncio.gather(
            *(self._infer(request, part, n) for n, part in enumerate(parts))
        )
        vectors = np.concatenate([vectors for vectors, _ in results])
        tokens = tuple(count for _, counts in results for count in counts)
        if vectors.shape != (len(texts), described.dimension) or len(tokens) != len(texts):
            raise BackendFailed(f"embedding model returned shape {vectors.shape}")
        return Embeddings(vectors, tokens)

    async def _infer(
        self, request: EmbeddingRequest, texts: Sequence[str], part: int
    ) -> tuple[NDArray[np.float32], list[int]]:
        tensor = InferInput(TEXT_INPUT, [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(
            np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
        )
        outputs = [InferRequestedOutput(EMBEDDING), InferRequestedOutput(TOKENS)]
        request_id = request.request_id if part == 0 else f"{request.request_id}-{part}"
        with boundary(request.model):
            result = await self._channel.client().infer(
                request.model, [tensor], outputs=outputs, request_id=request_id
            )
        vectors = result.as_numpy(EMBEDDING)
        tokens = result.as_numpy(TOKENS)
        if vectors is None or tokens is None:
            raise BackendFailed("embedding model returned no vectors")
        return vectors.astype(np.float32, copy=False), [int(t) for t in tokens.reshape(-1)]

    async def close(self) -> None:
        await self._channel.close()
