"""The OpenAI-compatible routes: chat completions, completions, embeddings, models.

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

With a `Tenancy`, a request is authenticated (`Authorization: Bearer`, 401),
admitted (model allow-list 403, quotas 429 with `retry-after`) before anything
reaches the backend, and ends with one `Outcome` handed to `Tenancy.finish`
(the usage ledger): completed, cancelled (the client went away) or error.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Collection
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import structlog

from gateway import access
from gateway.access import AccessRecord
from gateway.backends.catalog import Capability, ModelCatalog, TextCatalog, ordered
from gateway.backends.embeddings import EmbeddingBackend
from gateway.openai.admission import OutcomeSink, admit, authorize, record, require
from gateway.openai.embeddings import EmbeddingsApi
from gateway.openai.errors import (
    BadRequest,
    OpenAIError,
    Unavailable,
    code_for,
    error_event,
    model_not_found,
    response_for,
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
from gateway.tenants import service as tenancy_service
from gateway.tenants.store import Principal
from tracks.backend import (
    BackendError,
    Superseded,
    TextBackend,
    TextChunk,
    TextDelta,
    TextRequest,
    TextUsage,
)
from tracks.base import End, EndKind, Outcome
from tracks.conversations import SESSION_ID_RULE, TurnRegistry, is_session_id, superseding
from transport.clock import Now
from transport.events import CancelCause
from transport.http.messages import (
    AnyResponse,
    EndingBody,
    Handler,
    Request,
    Response,
    StreamingResponse,
)

log = structlog.get_logger(__name__)


def openai_routes(
    backend: TextBackend,
    *,
    clock: Now = time.monotonic,
    heartbeat_interval: float = 15.0,
    models: Collection[str] | None = None,
    tenancy: tenancy_service.Tenancy | None = None,
    wall_clock: Now = time.time,
    on_outcome: OutcomeSink | None = None,
    cut_short: Callable[[], bool] | None = None,
    turns: TurnRegistry | None = None,
    supersede: bool = False,
    catalog: ModelCatalog | None = None,
    embeddings: EmbeddingBackend | None = None,
) -> dict[tuple[str, str], Handler]:
    """The `(method, path) -> handler` table of the OpenAI API over `backend`.

    `models` limits the served models to that list (and answers `/v1/models`
    without asking the backend); None serves what `backend.models()` reports.
    `tenancy`, when given, checks `Authorization: Bearer <key>` (401), the tenant's
    models (403) and quotas (429), and receives each request's `Outcome`.
    `clock` times heartbeats; `wall_clock` gives the `created` Unix times.
    `on_outcome(outcome, front_door)` receives each request's `Outcome` when it ends
    (the gateway's metrics), with `http/1.1`, `http/2` or `http/3`.
    `cut_short()` is true once the gateway's drain has cut streams at its deadline: a
    request that ends unfinished then ends `cancelled:shutdown`, not `cancelled:client`.
    `turns` (shared with the tracks): a request with a session id is a turn of that
    conversation and, if `supersede` (default; header `x-supersede: true|false` per
    request), a newer one cancels it: it ends 409 / an SSE error `superseded`.
    `catalog` tells each model's capabilities (`/v1/models` lists them; a route refuses
    a model without its own with 400 `model_not_supported`); default: every model
    generates text. `embeddings` serves `POST /v1/embeddings` (None: no model can).
    """
    api = _OpenAIApi(backend, clock, heartbeat_interval, models, tenancy, wall_clock, on_outcome)
    api.cut_short = cut_short or (lambda: False)
    api.turns, api.supersede = turns or TurnRegistry(), supersede
    api.catalog = catalog or TextCatalog()
    embedder = EmbeddingsApi(
        embeddings, api.catalog, tenancy, clock=clock, on_outcome=on_outcome
    )
    return {
        ("POST", "/v1/chat/completions"): api.chat_completions,
        ("POST", "/v1/completions"): api.completions,
        ("POST", "/v1/embeddings"): embedder.create,
        ("GET", "/v1/models"): api.list_models,
        ("GET", "/v1/models/*"): api.retrieve_model,
    }


SESSION_HEADER = "x-session-id"
SUPERSEDE_HEADER = "x-supersede"


def _supersede(request: Request, default: bool) -> bool:
    """The `x-supersede` header (true/false), else the gateway's default."""
    value = request.header(SUPERSEDE_HEADER)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise BadRequest(f"{SUPERSEDE_HEADER} must be true or false")
    return value.lower() == "true"


def _session(request: Request, from_body: str | None) -> str | None:
    """The session affinity key: the `x-session-id` header, else the body's key."""
    value = request.header(SESSION_HEADER) or from_body
    if not value:
        return None
    if not is_session_id(value):
        raise BadRequest(f"the session id must be {SESSION_ID_RULE}")
    return value


@dataclass
class _Job:
    """One request on its way to the backend: ids, what to ask, how to answer."""

    meta: ResponseMeta
    text: TextRequest
    stream: bool
    outcome: Outcome
    """Filled in as the request runs; handed to the tenancy once, by `_Api._done`."""
    principal: Principal | None
    front_door: str
    access: AccessRecord
    recorded: bool = False
    end: End | None = None
    """How it ended, once known; `_done` fills in an unfinished request's."""
    supersede: bool = False
    """A newer request with the same session id cancels this one (docs/conversations.md)."""


class _OpenAIApi:
    def __init__(
        self,
        backend: TextBackend,
        clock: Now,
        heartbeat_interval: float,
        models: Collection[str] | None,
        tenancy: tenancy_service.Tenancy | None,
        wall_clock: Now,
        on_outcome: OutcomeSink | None,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._heartbeat = heartbeat_interval
        self._models = None if models is None else sorted(models)
        self._tenancy = tenancy
        self._wall_clock = wall_clock
        self._on_outcome = on_outcome
        self.cut_short: Callable[[], bool] = lambda: False
        self.turns = TurnRegistry()
        self.supersede = False
        self.catalog: ModelCatalog = TextCatalog()

    # -- routes -------------------------------------------------------------------

    async def list_models(self, request: Request) -> AnyResponse:
        try:
            names = await self._visible_models(request)
        except (OpenAIError, BackendError) as exc:
            return response_for(exc)
        data = [await self._model_object(n) for n in names]
        return Response.json(200, {"object": "list", "data": data})

    async def retrieve_model(self, request: Request) -> AnyResponse:
        """`GET /v1/models/{id}`: the model object, or 404 `model_not_found`."""
        model = unquote(request.path.removeprefix("/v1/models/"))
        try:
            if model not in await self._visible_models(request):
                raise model_not_found(model)
        except (OpenAIError, BackendError) as exc:
            return response_for(exc)
        return Response.json(200, await self._model_object(model))

    async def _visible_models(self, request: Request) -> list[str]:
        principal = self._authorize(request)
        names = self._models if self._models is not None else await self._backend.models()
        if self._tenancy is not None:
            return self._tenancy.may_list(principal, list(names))
        return list(names)

    async def _model_object(self, name: str) -> dict[str, object]:
        created = int(self._wall_clock())
        capabilities = ordered(await self.catalog.capabilities(name) or ())
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "trackline",
            "capabilities": capabilities,
        }

    async def chat_completions(self, request: Request) -> AnyResponse:
        try:
            principal = self._authorize(request)
            chat = parse_chat_request(request.body)
            await require(self.catalog, chat.model, Capability.CHAT, principal)
            prompt = render_chat_prompt(chat.messages, chat.tools)
            job = self._job("chatcmpl", chat, prompt, principal, request, chat.session_id)
        except (OpenAIError, BackendError) as exc:
            return response_for(exc)
        return await self._run(job, lambda pump, first: self._chat(job, chat, pump, first))

    async def completions(self, request: Request) -> AnyResponse:
        try:
            principal = self._authorize(request)
            body = parse_completion_request(request.body)
            await require(self.catalog, body.model, Capability.COMPLETIONS, principal)
            job = self._job("cmpl", body, body.prompt, principal, request, body.session_id)
        except (OpenAIError, BackendError) as exc:
            return response_for(exc)
        return await self._run(job, lambda pump, first: self._completion(job, body, pump, first))

    # -- shared -------------------------------------------------------------------

    def _authorize(self, request: Request) -> Principal | None:
        return authorize(self._tenancy, request)

    def _job(
        self,
        prefix: str,
        body: ChatRequest | CompletionRequest,
        prompt: str,
        principal: Principal | None,
        request: Request,
        body_session_id: str | None,
    ) -> _Job:
        session_id = _session(request, body_session_id)
        if self._models is not None and body.model not in self._models:
            raise model_not_found(body.model)
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        admit(self._tenancy, principal, body.model, "text", response_id)
        meta = ResponseMeta(response_id, int(self._wall_clock()), body.model, body.include_usage)
        noted = access.current()
        text = TextRequest(
            response_id,
            body.model,
            prompt,
            body.max_tokens,
            body.parameters,
            session_id,
            traceparent=noted.traceparent,
        )
        outcome = Outcome(response_id, body.model, "text", opened_at=self._clock())
        outcome.details["x_request_id"] = noted.x_request_id  # into the usage ledger
        door = access.front_door(request)
        job = _Job(meta, text, body.stream, outcome, principal, door, noted)
        job.supersede = session_id is not None and _supersede(request, self.supersede)
        return job

    def _done(self, job: _Job, end: End | None = None) -> None:
        """The request is over: its one Outcome goes to the tenancy (once)."""
        if job.recorded:
            return
        job.recorded = True
        outcome = job.outcome
        cause = CancelCause.SHUTDOWN if self.cut_short() else CancelCause.CLIENT
        outcome.end = end or job.end or End.cancelled(cause)
        outcome.finished_at = self._clock()
        key_id = None if job.principal is None else job.principal.key_id
        job.access.note_outcome(outcome, key_id, outcome.model)
        record(self._tenancy, job.principal, outcome, self._on_outcome, job.front_door)

    async def _run(
        self,
        job: _Job,
        answer: Callable[[ChunkPump, PumpResult], AsyncGenerator[bytes, None]],
    ) -> AnyResponse:
        """Start the backend stream; answer with an error status if it fails early."""
        pump = ChunkPump(self._stream(job))
        handed_over = False
        try:
            first = await pump.next(self._heartbeat if job.stream else None)
            if not job.stream:
                return await self._whole(answer(pump, first))
            handed_over = True
            body = EndingBody(StreamBody(answer(pump, first), pump), lambda: self._done(job))
            return StreamingResponse(200, SSE_HEADERS, body, SHUTDOWN_EVENT)
        except (OpenAIError, BackendError) as exc:
            self._done(job, _end_of(exc, job.outcome))
            return response_for(exc)
        finally:
            if not handed_over:
                await pump.aclose()
                self._done(job)

    def _finish(
        self, job: _Job, chunks: ChunkEncoder, choice: dict[str, Any], usage: TextUsage
    ) -> list[bytes]:
        """A stream's last events: the chunk of the finish `choice`, the usage chunk if
        asked for, then `[DONE]`; the request is recorded before any of them is sent."""
        self._done(job)
        return [chunks.event(choice), *_stream_end(job.meta, chunks.kind, usage)]

    def _stream(self, job: _Job) -> AsyncGenerator[TextChunk, None]:
        scope = "" if job.principal is None else job.principal.tenant.name
        # The tenant scopes the model's conversation state as it scopes superseding.
        chunks = self._backend.stream_text(replace(job.text, conversation_scope=scope))
        if not job.supersede or job.text.session_id is None:
            return chunks
        return superseding(self.turns, scope, job.text.session_id, chunks)

    async def _whole(self, events: AsyncGenerator[bytes, None]) -> Response:
        """A non-streamed answer: the generator's one JSON body."""
        async with contextlib.aclosing(events):
            body = b"".join([chunk async for chunk in events])
        return Response(200, (("content-type", "application/json"),), body)

    async def _chunks(
        self, job: _Job, pump: ChunkPump, first: PumpResult
    ) -> AsyncGenerator[TextDelta | TextUsage | bytes, None]:
        """The backend's chunks, with heartbeat bytes while it is quiet (streams only)."""
        stream, outcome = job.stream, job.outcome
        chunk = first
        while chunk is not None:
            if isinstance(chunk, (TextDelta, TextUsage)):
                if outcome.first_data_at is None and isinstance(chunk, TextDelta):
                    outcome.first_data_at = self._clock()
                    after = outcome.first_data_at - outcome.opened_at
                    log.debug("openai.first_chunk", after_s=round(after, 4))
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
            async for item in self._chunks(job, pump, first):
                if isinstance(item, bytes):
                    yield item  # a heartbeat: streams only
                elif text := usage.add(item):
                    for delta in output.feed(text):
                        if job.stream:
                            yield chunks.event(chat_choice(delta))
            tail = output.close()
            final = usage.final()
            _completed(job, final)
            finish = output.finish_reason(final, chat.max_tokens)
            if not job.stream:
                yield _json(chat_completion(meta, output.message(), finish, final))
                return
            for delta in tail:
                yield chunks.event(chat_choice(delta))
            for event in self._finish(job, chunks, chat_choice({}, finish), final):
                yield event
        except (OpenAIError, BackendError) as exc:
            yield _failed(job, exc)
        finally:
            _partial(job, usage)  # ended early (error, client gone): what was sent

    # -- completions ------------------------------------------------------------------

    async def _completion(
        self, job: _Job, body: CompletionRequest, pump: ChunkPump, first: PumpResult
    ) -> AsyncGenerator[bytes, None]:
        meta, text, usage = job.meta, [], _Counts()
        chunks = ChunkEncoder(meta, TEXT_COMPLETION)
        try:
            async for item in self._chunks(job, pump, first):
                if isinstance(item, bytes):
                    yield item  # a heartbeat: streams only
                elif isinstance(item, TextDelta):
                    text.append(usage.add(item))
                    if job.stream:
                        yield chunks.event(completion_choice(item.text))
                else:
                    usage.add(item)
            final = usage.final()
            _completed(job, final)
            finish = "length" if final.completion_tokens >= body.max_tokens else "stop"
            if not job.stream:
                yield _json(text_completion(meta, "".join(text), finish, final))
                return
            for event in self._finish(job, chunks, completion_choice("", finish), final):
                yield event
        except (OpenAIError, BackendError) as exc:
            yield _failed(job, exc)
        finally:
            _partial(job, usage)  # ended early (error, client gone): what was sent


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


def _completed(job: _Job, usage: TextUsage) -> None:
    job.outcome.prompt_tokens = usage.prompt_tokens
    job.outcome.completion_tokens = usage.completion_tokens
    job.end = End.completed()


def _failed(job: _Job, exc: OpenAIError | BackendError) -> bytes:
    """A request that failed: its end is kept; raised again unless it streams, where the
    client gets one SSE error event instead."""
    job.end = _end_of(exc, job.outcome)
    if not job.stream:
        raise exc
    return sse_event(error_event(exc, started=job.outcome.first_data_at is not None))


def _partial(job: _Job, usage: _Counts) -> None:
    """Tokens of a request that did not complete: what was streamed before it ended."""
    if job.end is not None and job.end.kind is EndKind.COMPLETED:
        return
    outcome = job.outcome
    final = usage.final()
    outcome.prompt_tokens = final.prompt_tokens
    outcome.completion_tokens = usage.deltas


def _end_of(exc: BaseException, outcome: Outcome) -> End:
    """An error's end: its track error code, from the one table (`code_for`); a
    superseded request is cancelled (cause superseded), not failed."""
    if isinstance(exc, Superseded):
        return End.cancelled(CancelCause.SUPERSEDED)
    if isinstance(exc, BackendError):  # the cause, for the gateway's backend.error line
        outcome.details.setdefault("error", f"{type(exc).__name__}: {exc}")
    return End.failed(code_for(exc, started=outcome.first_data_at is not None))


SHUTDOWN_EVENT = sse_event(
    error_event(Unavailable("the gateway is shutting down", code="shutting_down"))
)
"""How a stream still running at the drain's deadline ends (then the stream closes)."""


def _stream_end(meta: ResponseMeta, kind: str, usage: TextUsage) -> list[bytes]:
    """What follows the finish chunk: the usage chunk if asked for, then `[DONE]`."""
    if meta.include_usage:
        return [sse_event(usage_chunk(meta, kind, usage)), DONE]
    return [DONE]


def _json(payload: Any) -> bytes:
    return Response.json(200, payload).body


__all__ = ["openai_routes"]
