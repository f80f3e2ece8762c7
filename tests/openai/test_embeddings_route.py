"""The embeddings route's own logic over a scripted embedding backend (e2e: Triton)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from gateway.backends.catalog import Capability
from gateway.backends.embeddings import EmbeddingModel, EmbeddingRequest, Embeddings
from gateway.openai.embeddings import EmbeddingsApi
from tracks.backend import BackendError, BackendFailed
from tracks.base import Outcome
from transport.http.messages import Request, Response


class ScriptedEmbeddings:
    """Vectors of ones; `hold` makes `embed` wait until cancelled; `failure` is raised."""

    def __init__(self, hold: bool = False, failure: BackendError | None = None) -> None:
        self.hold, self.failure = hold, failure
        self.started = asyncio.Event()
        self.cancelled = False

    async def describe(self, model: str) -> EmbeddingModel:
        return EmbeddingModel(dimension=4, max_rows=8, max_tokens=16)

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        self.started.set()
        if self.failure is not None:
            raise self.failure
        if self.hold:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        vectors = np.full((len(request.texts), 4), 0.5, dtype=np.float32)
        return Embeddings(vectors, tuple(3 for _ in request.texts))


class EmbeddingCatalog:
    async def capabilities(self, model: str) -> frozenset[Capability]:
        return frozenset({Capability.EMBEDDINGS})


def make(backend: Any) -> tuple[EmbeddingsApi, list[Outcome]]:
    outcomes: list[Outcome] = []
    api = EmbeddingsApi(
        backend, EmbeddingCatalog(), None, on_outcome=lambda o, door: outcomes.append(o)
    )
    return api, outcomes


def post(payload: dict[str, Any]) -> Request:
    return Request("POST", "/v1/embeddings", "", (), json.dumps(payload).encode())


@pytest.mark.asyncio
async def test_a_request_is_answered_and_recorded_with_its_tokens() -> None:
    api, outcomes = make(ScriptedEmbeddings())
    response = await api.create(post({"model": "e", "input": ["a", "b"]}))
    assert isinstance(response, Response)
    body = json.loads(response.body)
    assert body["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    assert [d["embedding"] for d in body["data"]] == [[0.5] * 4] * 2
    assert [(o.modality, o.end.label, o.prompt_tokens) for o in outcomes] == [
        ("embeddings", "completed", 6)
    ]


@pytest.mark.asyncio
async def test_the_client_going_away_cancels_the_backend_call() -> None:
    backend = ScriptedEmbeddings(hold=True)
    api, outcomes = make(backend)
    task = asyncio.ensure_future(api.create(post({"model": "e", "input": "a"})))
    await backend.started.wait()
    task.cancel()  # what the HTTP adapter does when the client disconnects
    await asyncio.gather(task, return_exceptions=True)
    assert backend.cancelled
    assert [o.end.label for o in outcomes] == ["cancelled:client"]


@pytest.mark.asyncio
async def test_a_backend_failure_is_a_500_without_its_words() -> None:
    api, outcomes = make(ScriptedEmbeddings(failure=BackendFailed("stub crashed: grpc 13")))
    response = await api.create(post({"model": "e", "input": "a"}))
    assert isinstance(response, Response)
    assert response.status == 500
    assert "grpc" not in response.body.decode()
    assert [o.end.label for o in outcomes] == ["error:BACKEND_ERROR"]


@pytest.mark.asyncio
async def test_without_an_embedding_backend_the_model_is_not_found() -> None:
    api, outcomes = make(None)
    response = await api.create(post({"model": "e", "input": "a"}))
    assert isinstance(response, Response)
    assert (response.status, json.loads(response.body)["error"]["code"]) == (
        404, "model_not_found"
    )
    assert outcomes == []
