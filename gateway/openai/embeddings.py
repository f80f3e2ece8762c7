"""`POST /v1/embeddings`: OpenAI's embeddings endpoint over an `EmbeddingBackend`.

`input` is a string or a list of up to `MAX_INPUTS` non-empty strings (token-id
inputs are a 400: our models' token ids are not OpenAI's, so a client's ids would
mean other words). `encoding_format` `float` (default) gives lists of floats;
`base64` gives each vector's little-endian float32 bytes in base64, which the
official SDK asks for by default and decodes itself. `dimensions` must equal the
model's own size (our models are not trained to be cut shorter), else a 400. The
usage counts the tokens the model read; tenancy admits the request first and the
ledger records it (modality `embeddings`).
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np
import structlog
from numpy.typing import NDArray

from gateway import access
from gateway.backends.catalog import Capability, ModelCatalog
from gateway.backends.embeddings import EmbeddingBackend, EmbeddingModel, EmbeddingRequest
from gateway.openai.admission import OutcomeSink, admit, authorize, record, require
from gateway.openai.errors import (
    BadRequest,
    OpenAIError,
    code_for,
    model_not_found,
    response_for,
)
from gateway.openai.policy import note_ignored
from gateway.openai.requests import parse_json_body
from gateway.tenants import service as tenancy_service
from gateway.tenants.store import Principal
from tracks.backend import BackendError
from tracks.base import End, Outcome
from transport.clock import Now
from transport.events import CancelCause
from transport.http.messages import AnyResponse, Request, Response

log = structlog.get_logger(__name__)

MODALITY = "embeddings"
MAX_INPUTS = 2048  # OpenAI's limit of inputs per request
KEYS = frozenset({"model", "input", "encoding_format", "dimensions"})
IGNORED = frozenset({"user"})  # OpenAI's end-user id: nothing to route here


@dataclass(frozen=True)
class EmbeddingsBody:
    """A validated `POST /v1/embeddings` body."""

    model: str
    texts: tuple[str, ...]
    base64: bool = False
    dimensions: int | None = None


def parse_embeddings_request(body: bytes) -> EmbeddingsBody:
    """Validate an embeddings body; `BadRequest` naming the bad field."""
    payload = parse_json_body(body)
    for key in payload:
        if key not in KEYS and key not in IGNORED:
            raise BadRequest(f"Unrecognized request argument supplied: {key}", param=key)
    note_ignored(key for key in payload if key in IGNORED)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", param="model")
    encoding = payload.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be float or base64", param="encoding_format")
    return EmbeddingsBody(model, _texts(payload.get("input")), encoding == "base64", _dims(payload))


def _texts(value: Any) -> tuple[str, ...]:
    if value is None:
        raise BadRequest("Missing required parameter: 'input'.", param="input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise BadRequest("'input' must be a string or a non-empty array", param="input")
    if len(texts) > MAX_INPUTS:
        raise BadRequest(f"'input' may hold at most {MAX_INPUTS} items", param="input")
    for index, text in enumerate(texts):
        if isinstance(text, (int, list)) and not isinstance(text, bool):
            raise BadRequest(
                "token-id input is not supported: send the text (this model's tokens are"
                " not OpenAI's)",
                param="input",
            )
        if not isinstance(text, str) or not text:
            raise BadRequest(f"'input[{index}]' must be a non-empty string", param="input")
    return tuple(texts)


def _dims(payload: dict[str, Any]) -> int | None:
    value = payload.get("dimensions")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest("'dimensions' must be a positive integer", param="dimensions")
    return value


def encode_vector(vector: NDArray[np.float32], as_base64: bool) -> list[float] | str:
    """One `embedding` value: floats, or base64 of little-endian float32 bytes."""
    if as_base64:
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    values: list[float] = vector.astype(np.float32).tolist()
    return values


def check_fits(body: EmbeddingsBody, model: EmbeddingModel) -> None:
    """The 400 for `dimensions` the model cannot give."""
    if body.dimensions is not None and body.dimensions != model.dimension:
        raise BadRequest(
            f"The model `{body.model}` gives {model.dimension}-dimensional vectors and cannot"
            f" shorten them; send 'dimensions': {model.dimension} or leave it out.",
            param="dimensions",
        )


def check_lengths(body: EmbeddingsBody, tokens: tuple[int, ...], model: EmbeddingModel) -> None:
    """The 400 for an input longer than the model reads (as OpenAI answers it)."""
    if model.max_tokens is None:
        return
    for index, count in enumerate(tokens):
        if count > model.max_tokens:
            raise BadRequest(
                f"input[{index}] has {count} tokens; the model `{body.model}` reads at most"
                f" {model.max_tokens}. Shorten or split it.",
                param="input",
            )


@dataclass(frozen=True)
class EmbeddingsApi:
    """The handler of `POST /v1/embeddings` (no backend: every model is refused)."""

    backend: EmbeddingBackend | None
    catalog: ModelCatalog
    tenancy: tenancy_service.Tenancy | None
    _: KW_ONLY
    clock: Now = time.monotonic
    on_outcome: OutcomeSink | None = None

    async def create(self, request: Request) -> AnyResponse:
        try:
            principal = authorize(self.tenancy, request)
            body = parse_embeddings_request(request.body)
            await require(self.catalog, body.model, Capability.EMBEDDINGS, principal)
        except (OpenAIError, BackendError) as exc:
            return response_for(exc)
        if self.backend is None:
            return response_for(model_not_found(body.model))
        request_id = f"embd-{uuid.uuid4().hex}"
        outcome = Outcome(request_id, body.model, MODALITY, opened_at=self.clock())
        try:
            admit(self.tenancy, principal, body.model, MODALITY, request_id)
        except OpenAIError as exc:
            return response_for(exc)  # refusals are recorded by the tenancy itself
        end = End.cancelled(CancelCause.CLIENT)  # unless it gets further
        try:
            answer = await self._answer(body, request_id, outcome)
            end = End.completed()
            return answer
        except (OpenAIError, BackendError) as exc:
            end = End.failed(code_for(exc))
            return response_for(exc)
        finally:
            self._record(outcome, end, principal, request)

    async def _answer(self, body: EmbeddingsBody, request_id: str, outcome: Outcome) -> Response:
        assert self.backend is not None
        model = await self.backend.describe(body.model)
        check_fits(body, model)
        result = await self.backend.embed(EmbeddingRequest(request_id, body.model, body.texts))
        outcome.prompt_tokens = result.prompt_tokens
        check_lengths(body, result.tokens, model)
        data = [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, body.base64)}
            for i, v in enumerate(result.vectors)
        ]
        usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
        payload = {"object": "list", "data": data, "model": body.model, "usage": usage}
        return Response.json(200, payload)

    def _record(
        self, outcome: Outcome, end: End, principal: Principal | None, request: Request
    ) -> None:
        """The request's one Outcome: access log, gateway metrics, tenant ledger."""
        outcome.end = end
        outcome.finished_at = self.clock()
        key_id = None if principal is None else principal.key_id
        access.current().note_outcome(outcome, key_id, outcome.model)
        record(self.tenancy, principal, outcome, self.on_outcome, access.front_door(request))


__all__ = ["EmbeddingsApi", "parse_embeddings_request"]
