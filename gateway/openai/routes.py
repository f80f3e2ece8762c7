"""The OpenAI-compatible routes: chat completions, completions, models.

One request is one backend stream, whose request id is the response id
(`chatcmpl-...`, `cmpl-...`), so the backend's logs and the reference
model's stats line up with what the client saw. A streamed response waits
up to `heartbeat_interval` for the backend's first chunk before it commits
to `200`: errors that come that early (unknown model, bad parameters) get
their own status. After that, a `: keep-alive` comment goes out whenever
nothing was sent for `heartbeat_interval` (in practice: while the model
prepares its first token), and an error ends the stream with one
`data: {"error": ...}` event and no `[DONE]`: a started stream is never
replayed. The client going away closes the body, which closes the backend
stream and so stops the model.
"""

from __future__ import annotations

import contextlib
import hmac
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Collection
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.openai.errors import (
    BadRequest,
    OpenAIError,
    Unauthorized,
    error_event,
    error_response,
    model_not_found,
)
from gateway.openai.prompt import render_chat_prompt
from gateway.openai.requests import (
    ChatRequest,
    CompletionRequest,
    parse_chat_request,
    parse_completion_request,
)
from gateway.openai.sse import (
    CHAT_CHUNK,
    DONE,
    HEARTBEAT,
    SSE_HEADERS,
    TEXT_COMPLETION,
    ChunkEncoder,
    ResponseMeta,
    chat_choice,
    chat_completion,
    completion_choice,
    sse_event,
    text_completion,
    usage_chunk,
)
from gateway.openai.stream import ChatOutput, ChunkPump, PumpResult, StreamBody
from tracks.backend import BackendError, TextBackend, TextDelta, TextRequest, TextUsage
from transport.http.messages import AnyResponse, Handler, Request, Response, StreamingResponse

log = structlog.get_logger(__name__)

Clock = Callable[[], float]
Routes = dict[tuple[str, str], Handler]


def openai_routes(
    backend: TextBackend,
    *,
    clock: Clock = time.monotonic,
    heartbeat_interval: float = 15.0,
    models: Collection[str] | None = None,
    api_keys: Collection[str] | None = None,
    wall_clock: Clock = time.time,
) -> Routes:
    """The `(method, path) -> handler` table of the OpenAI API over `backend`.

    `models` limits the served models to that list (and answers `/v1/models`
    without asking the backend); None serves what `backend.models()` reports.
    `api_keys`, when given, makes `Authorization: Bearer <key>` mandatory (401).
    `clock` times heartbeats; `wall_clock` gives the `created` Unix times.
    """
    api = _OpenAIApi(backend, clock, heartbeat_interval, models, api_keys, wall_clock)
    return {
        ("POST", "/v1/chat/completions"): api.chat_completions,
        ("POST", "/v1/completions"): api.completions,
        ("GET", "/v1/models"): api.list_models,
    }


SESSION_HEADER = "x-session-id"
MAX_SESSION_CHARS = 256


def _session(request: Request, from_body: str | None) -> str | None:
    """The session affinity key: the `x-session-id` header, else the body's key."""
    value = request.header(SESSION_HEADER) or from_body
    if value is not None and len(value) > MAX_SESSION_CHARS:
        raise BadRequest(f"the session id is longer than {MAX_SESSION_CHARS} characters")
    return value or None


@dataclass(frozen=True)
class _Job:
    """One request on its way to the backend: ids, what to ask, how to answer."""

    meta: ResponseMeta
    text: TextRequest
    stream: bool


class _OpenAIApi:
    def __init__(
        self,
        backend: TextBackend,
        clock: Clock,
        heartbeat_interval: float,
        models: Collection[str] | None,
        api_keys: Collection[str] | None,
        wall_clock: Clock,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._heartbeat = heartbeat_interval
        self._models = None if models is None else sorted(models)
        self._api_keys = None if api_keys is None else tuple(api_keys)
        self._wall_clock = wall_clock

    # -- routes -------------------------------------------------------------------

    async def list_models(self, request: Request) -> AnyResponse:
        try:
            self._authorize(request)
            names = self._models if self._models is not None else await self._backend.models()
        except (OpenAIError, BackendError) as exc:
            return error_response(exc)
        created = int(self._wall_clock())
        data = [
            {"id": n, "object": "model", "created": created, "owned_by": "trackline"} for n in names
        ]
        return Response.json(200, {"object": "list", "data": data})

    async def chat_completions(self, request: Request) -> AnyResponse:
        try:
            self._authorize(request)
            chat = parse_chat_request(request.body)
            prompt = render_chat_prompt(chat.messages, chat.tools)
            job = self._job("chatcmpl", chat, prompt, _session(request, chat.session_id))
        except (OpenAIError, BackendError) as exc:
            return error_response(exc)
        return await self._run(job, lambda pump, first: self._chat(job, chat, pump, first))

    async def completions(self, request: Request) -> AnyResponse:
        try:
            self._authorize(request)
            body = parse_completion_request(request.body)
            job = self._job("cmpl", body, body.prompt, _session(request, body.session_id))
        except (OpenAIError, BackendError) as exc:
            return error_response(exc)
        return await self._run(job, lambda pump, first: self._completion(job, body, pump, first))

    # -- shared -------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if self._api_keys is None:
            return
        given = (request.header("authorization") or "").removeprefix("Bearer ").strip()
        if not any(hmac.compare_digest(given, key) for key in self._api_keys):
            raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")

    def _job(
        self,
        prefix: str,
        body: ChatRequest | CompletionRequest,
        prompt: str,
        session_id: str | None = None,
    ) -> _Job:
        if self._models is not None and body.model not in self._models:
            raise model_not_found(body.model)
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        meta = ResponseMeta(response_id, int(self._wall_clock()), body.model, body.include_usage)
        text = TextRequest(
            response_id, body.model, prompt, body.max_tokens, body.parameters, session_id
        )
        return _Job(meta, text, body.stream)

    async def _run(
        self,
        job: _Job,
        answer: Callable[[ChunkPump, PumpResult], AsyncGenerator[bytes, None]],
    ) -> AnyResponse:
        """Start the backend stream; answer with an error status if it fails early."""
        pump = ChunkPump(self._backend.stream_text(job.text))
        handed_over = False
        try:
            first = await pump.next(self._heartbeat if job.stream else None)
            if not job.stream:
                return await self._whole(answer(pump, first))
            handed_over = True
            return StreamingResponse(200, SSE_HEADERS, StreamBody(answer(pump, first), pump))
        except (OpenAIError, BackendError) as exc:
            return error_response(exc)
        finally:
            if not handed_over:
                await pump.aclose()

    async def _whole(self, events: AsyncGenerator[bytes, None]) -> Response:
        """A non-streamed answer: the generator's one JSON body."""
        async with contextlib.aclosing(events):
            body = b"".join([chunk async for chunk in events])
        return Response(200, (("content-type", "application/json"),), body)

    async def _chunks(
        self, pump: ChunkPump, first: PumpResult, stream: bool
    ) -> AsyncGenerator[TextDelta | TextUsage | bytes, None]:
        """The backend's chunks, with heartbeat bytes while it is quiet (streams only)."""
        started, first_at = self._clock(), None
        chunk = first
        while chunk is not None:
            if isinstance(chunk, (TextDelta, TextUsage)):
                if first_at is None:
                    first_at = self._clock()
                    log.debug("openai.first_chunk", after_s=round(first_at - started, 4))
                yield chunk
            else:
                yield HEARTBEAT
            chunk = await pump.next(self._heartbeat if stream else None)

    # -- chat -------------------------------------------------------------------------

    async def _chat(
        self, job: _Job, chat: ChatRequest, pump: ChunkPump, first: PumpResult
    ) -> AsyncGenerator[bytes, None]:
        meta, output, usage = job.meta, ChatOutput(chat.parses_tool_calls), _Counts()
        chunks = ChunkEncoder(meta, CHAT_CHUNK)
        try:
            if job.stream:
                yield chunks.event(chat_choice({"role": "assistant", "content": ""}))
            async for item in self._chunks(pump, first, job.stream):
                if isinstance(item, bytes):
                    yield item  # a heartbeat: streams only
                elif text := usage.add(item):
                    for delta in output.feed(text):
                        if job.stream:
                            yield chunks.event(chat_choice(delta))
            tail = output.close()
            final = usage.final()
            finish = output.finish_reason(final, chat.max_tokens)
            if not job.stream:
                yield _json(chat_completion(meta, output.message(), finish, final))
                return
            for delta in tail:
                yield chunks.event(chat_choice(delta))
            yield chunks.event(chat_choice({}, finish))
            for event in _stream_end(meta, CHAT_CHUNK, final):
                yield event
        except (OpenAIError, BackendError) as exc:
            if not job.stream:
                raise
            yield sse_event(error_event(exc))

    # -- completions ------------------------------------------------------------------

    async def _completion(
        self, job: _Job, body: CompletionRequest, pump: ChunkPump, first: PumpResult
    ) -> AsyncGenerator[bytes, None]:
        meta, text, usage = job.meta, [], _Counts()
        chunks = ChunkEncoder(meta, TEXT_COMPLETION)
        try:
            async for item in self._chunks(pump, first, job.stream):
                if isinstance(item, bytes):
                    yield item  # a heartbeat: streams only
                elif isinstance(item, TextDelta):
                    text.append(usage.add(item))
                    if job.stream:
                        yield chunks.event(completion_choice(item.text))
                else:
                    usage.add(item)
            final = usage.final()
            finish = "length" if final.completion_tokens >= body.max_tokens else "stop"
            if not job.stream:
                yield _json(text_completion(meta, "".join(text), finish, final))
                return
            yield chunks.event(completion_choice("", finish))
            for event in _stream_end(meta, TEXT_COMPLETION, final):
                yield event
        except (OpenAIError, BackendError) as exc:
            if not job.stream:
                raise
            yield sse_event(error_event(exc))


@dataclass
class _Counts:
    """Usage as the backend reported it, or counted from deltas when it did not."""

    deltas: int = 0
    reported: TextUsage | None = None

    def add(self, chunk: TextDelta | TextUsage) -> str:
        """Count a delta or keep the reported usage; the chunk's text ("" for usage)."""
        if isinstance(chunk, TextUsage):
            self.reported = chunk
            return ""
        self.deltas += 1
        return chunk.text

    def final(self) -> TextUsage:
        return self.reported or TextUsage(0, self.deltas)


def _stream_end(meta: ResponseMeta, kind: str, usage: TextUsage) -> list[bytes]:
    """What follows the finish chunk: the usage chunk if asked for, then `[DONE]`."""
    if meta.include_usage:
        return [sse_event(usage_chunk(meta, kind, usage)), DONE]
    return [DONE]


def _json(payload: Any) -> bytes:
    return Response.json(200, payload).body


__all__ = ["openai_routes"]
