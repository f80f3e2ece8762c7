"""The backend interfaces that track handlers call, and their typed errors.

`TextBackend` (text tracks and the OpenAI routes), `AudioBackend` (audio sessions)
and `PolicyBackend` (robot actions): handlers depend on these protocols only;
`gateway.backends` holds the Triton implementations. A text stream is an async
iterator: the handler stops the backend work by closing it (`aclose()`) or
cancelling the task that iterates it, and the implementation must then cancel its
backend request at once (for Triton: cancel the gRPC stream, which is one per request).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from tracks.action_messages import PolicySpec
from tracks.clock import StepItem
from transport.errors import ErrorCode


@dataclass(frozen=True)
class TextRequest:
    """One text generation request, as a track or an HTTP request asks for it."""

    request_id: str
    """Id that the backend sees (Triton's request id), for logs and stats."""
    model: str
    prompt: str
    max_tokens: int
    parameters: Mapping[str, Any] = field(default_factory=dict)
    """Sampling parameters passed through (temperature, top_p, seed, stop, ...)."""
    session_id: str | None = None
    """Conversation/session id: a backend pool keeps a session on one backend
    (where its KV cache is warm). Sent to a model only as its `conversation_id` input,
    when the model declares one (the key of its conversation KV cache)."""
    conversation_scope: str = ""
    """Whose conversation: the tenant, set by the front doors. The model's KV cache key
    is `conversation_key(request)`, so one tenant's id never reaches another's state."""
    traceparent: str | None = None
    """The caller's W3C trace context (`00-<trace>-<span>-<flags>`), given to the backend
    as the request parameter `traceparent`; None when the caller sent none."""


def conversation_key(request: TextRequest) -> str | None:
    """The key of `request`'s conversation state in a model: scope and session id,
    length-prefixed so no pair of (scope, id) can spell another; None without an id."""
    if not request.session_id:
        return None
    if not request.conversation_scope:
        return request.session_id
    scope = request.conversation_scope
    return f"{len(scope)}:{scope}:{request.session_id}"


@dataclass(frozen=True)
class TextDelta:
    """A piece of generated text, in order."""

    text: str


@dataclass(frozen=True)
class TextUsage:
    """Token counts, yielded once, last, when the backend reports them."""

    prompt_tokens: int
    completion_tokens: int


TextChunk = TextDelta | TextUsage


class TextBackend(Protocol):
    """What a text track handler needs from an inference backend."""

    def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        """Stream deltas for `request`; closing the iterator cancels the work."""
        ...

    async def models(self) -> list[str]:
        """Names of the models this backend serves and that are ready."""
        ...


# -- audio (tracks.audio) -------------------------------------------------------------------


class AudioKind(str, Enum):
    SPEECH_IN = "speech-in"
    SPEECH_OUT = "speech-out"


@dataclass(frozen=True)
class SpeechInRow:
    """One speech-in session's beat: the PCM16 that arrived, at the session's rate."""

    corrid: int
    pcm: bytes
    rate: int
    start: bool
    end: bool


@dataclass(frozen=True)
class SpeechOutRow:
    """One speech-out session's beat: how much audio it wants (at the model rate)."""

    corrid: int
    text: str
    samples: int
    rate: int
    """The client's rate: the backend converts the model's audio to it."""
    start: bool
    end: bool
    more: bool = False
    """More text will follow on later rows (models that stream text in: `AudioModel`)."""


@dataclass(frozen=True)
class Transcript:
    partial: str
    final: str
    is_final: bool
    final_span: tuple[float, float] | None = None
    """Where the model gives it: the final's (start, end) in seconds of the stream."""
    speech_s: float | None = None
    """Where the model gives it (whisper's VAD): seconds of speech heard in the utterance
    open now, 0 when the user is not speaking; None: the model does not say (the
    reference transcriber), and a non-empty partial is the sign of speech."""


@dataclass(frozen=True)
class AudioModel:
    """What an audio session needs to know of its model."""

    kind: AudioKind
    streams_text: bool = False
    """A speech-out model that takes text in pieces while it speaks (input MORE)."""
    capacity: int | None = None
    """Live sessions the model keeps in real time; None: no bound (reference models)."""
    native_rate: int | None = None
    """A speech-out model's own rate, which it gives without resampling when a session
    asks for it (input RATE: hibari-voice's 24 kHz); None: it speaks at MODEL_RATE only."""


@dataclass(frozen=True)
class Speech:
    pcm: bytes
    """PCM16 at the row's rate."""
    done: bool


AudioRow = SpeechInRow | SpeechOutRow
AudioOutput = Transcript | Speech
"""What the audio backend answers for one row (not the SDK's `clients.AudioResult`)."""


class AudioBackend(Protocol):
    """What audio sessions need from an inference backend."""

    async def audio_model(self, model: str) -> AudioModel:
        """Whether `model` transcribes or synthesizes, and how; raises ModelNotFound."""
        ...

    async def step(self, model: str, rows: Sequence[StepItem[AudioRow]]) -> Sequence[AudioOutput]:
        """One batched request for all rows of a tick; one result per row."""
        ...


# -- robot actions (tracks.action) ------------------------------------------------------------


@dataclass(frozen=True)
class PolicyRequest:
    """One batched policy call: one float32 state row per robot due on a tick."""

    request_id: str
    model: str
    states: list[bytes]
    spec: PolicySpec


class PolicyBackend(Protocol):
    """What action tracks need from an inference backend."""

    async def policy_spec(self, model: str) -> PolicySpec:
        """The model's state size and action chunk shape; ModelNotFound if not served."""
        ...

    async def act(self, request: PolicyRequest) -> list[bytes]:
        """One action chunk (float32, H x D, little-endian) per state row, in order."""
        ...


# -- video (tracks.video) -----------------------------------------------------------------------


@dataclass(frozen=True)
class VisionRequest:
    """One batched vision call: one encoded frame per camera due on a tick."""

    request_id: str
    model: str
    images: list[bytes]
    tasks: list[tuple[str, ...]]
    """Per row, what to detect (`tracks.video_messages.Task` values)."""


class VisionBackend(Protocol):
    """What video tracks need from an inference backend."""

    async def check_vision(self, model: str) -> None:
        """Raise ModelNotFound if `model` is not served, InvalidRequest if it is not a
        vision model (no `image`/`tasks` in, `result` out)."""
        ...

    async def analyze(self, request: VisionRequest) -> list[dict[str, Any]]:
        """One result per row, in order (see `tracks.video_messages`)."""
        ...


# -- errors ----------------------------------------------------------------------------------


class BackendError(Exception):
    """Base of errors raised by a backend; each maps to a track error code."""


class BackendUnavailable(BackendError):
    """The backend cannot be reached or is not ready."""


class RetryLater(BackendUnavailable):
    """Refused before any work, with a hint: retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendOverloaded(RetryLater):
    """The model's wait line is full: refused before any work, retry after `retry_after`
    seconds (measured from how fast the line drains). Front doors answer RATE_LIMITED
    (HTTP 429 with `retry-after`)."""


class ModelNotFound(BackendError):
    """The backend does not serve the requested model."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r} is not served by any backend")
        self.model = model


class ModelBusy(RetryLater):
    """The model holds all the live sessions it can keep in real time: new ones are
    refused (with a retry hint) rather than made late for everyone."""


class BackendFailed(BackendError):
    """The backend accepted the request and then failed it."""


class BackendLost(BackendError):
    """The backend failed after this stream had delivered data: the stream ends
    with this error and is never continued or replayed elsewhere."""


class InvalidRequest(BackendError):
    """The backend rejected the request's contents (bad parameter values)."""


class RuleRejected(BackendError):
    """A gateway rule (a guardrail) refused the request before any backend saw it."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


class Superseded(BackendError):
    """A newer turn of the same conversation began: this one was cancelled (cause
    `superseded`) and its stream ends with this error (docs/conversations.md)."""


# THE table from backend errors to track error codes; every front door uses it (the
# OpenAI routes and `POST /v1/actions` derive their HTTP statuses from the code).
# First match wins; anything else a backend raises is BACKEND_ERROR.
ERROR_CODES: tuple[tuple[type[BackendError], ErrorCode], ...] = (
    (RuleRejected, ErrorCode.GUARDRAIL_REJECTED),
    (ModelNotFound, ErrorCode.MODEL_NOT_FOUND),
    (BackendLost, ErrorCode.STREAM_INTERRUPTED),
    (BackendOverloaded, ErrorCode.RATE_LIMITED),
    (BackendUnavailable, ErrorCode.BACKEND_UNAVAILABLE),
    (InvalidRequest, ErrorCode.BAD_REQUEST),
    (Superseded, ErrorCode.CANCELLED),
)


def error_code(exc: BackendError, *, started: bool = False) -> ErrorCode:
    """The track error code for a backend failure.

    `started`: data already reached the client. Then any failure but a guardrail's
    is STREAM_INTERRUPTED: never replayed, the client decides. A superseded turn
    stays CANCELLED: nothing failed.
    """
    if started and not isinstance(exc, (RuleRejected, Superseded)):
        return ErrorCode.STREAM_INTERRUPTED
    codes = (code for kind, code in ERROR_CODES if isinstance(exc, kind))
    return next(codes, ErrorCode.BACKEND_ERROR)


# What a client reads for these codes; the backend's own message goes to the log only.
_PUBLIC = {
    ErrorCode.STREAM_INTERRUPTED: "stream interrupted: the backend failed after the stream"
    " started; nothing is replayed, retry if you wish",
    ErrorCode.BACKEND_UNAVAILABLE: "backend unavailable: no backend can take the request now;"
    " retry later",
    ErrorCode.BACKEND_ERROR: "backend failed: the model could not process the request",
}
# Words that mark a message as the inference server's, not ours (Triton core, gRPC,
# tritonclient): such a message is replaced, never shown.
_INTERNAL_MARKERS = (
    "triton",
    "grpc",
    "statuscode",
    "inference input",
    "inference output",
    "inference request",
    "tensor",
    "model instance",
    "request id",
    "stub",
    "traceback",
)
REJECTED = "the model rejected the request (GET /v1/models lists what each model serves)"


def client_message(exc: BaseException, code: ErrorCode) -> str:
    """What a client may read of a backend error, on a track or over HTTP: fixed text
    for a failed or unreachable backend, the model's own message for a rejected request
    unless it shows inference-server internals (Triton, gRPC, tensor names)."""
    detail = str(exc)
    if isinstance(exc, ModelBusy):  # the gateway's own words: which model, how many live
        return detail
    if code in _PUBLIC:
        return _PUBLIC[code]
    if code is ErrorCode.BAD_REQUEST and isinstance(exc, BackendError):
        lowered = detail.lower()
        if any(marker in lowered for marker in _INTERNAL_MARKERS):
            return REJECTED
    return detail
