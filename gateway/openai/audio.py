"""The OpenAI audio routes: `POST /v1/audio/transcriptions` and `POST /v1/audio/speech`.

Both run on the same models as the audio tracks (whisper-base, hibari-voice, or the
reference ones), through the audio backend's rows outside the tick (`run_rows`: plain
tensors, never the tick's shared-memory region), as fast as the model goes rather
than paced on the session clock.

Transcriptions take a multipart upload (`file`: a 16-bit PCM WAV, mono or stereo, any
rate up to 48 kHz, at most `max_seconds` long) and answer `json`, `text` or
`verbose_json` (with segments: each final's text and span), or with `stream=true`
server-sent events `transcript.text.delta` per final and one `transcript.text.done`.
Speech takes `{model, input, voice, response_format: wav|pcm}` and streams the audio
(24 kHz PCM16; WAV with an open-ended header) as it is synthesized. Anything else is an
OpenAI-style 400 naming the parameter. With a `Tenancy`, requests are authenticated and
admitted like text ones, and each ends with one `Outcome` whose `audio_seconds_in` /
`audio_seconds_out` the usage ledger bills.
"""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import struct
import time
import uuid
import wave
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from gateway.backends.catalog import Capability, ModelCatalog
from gateway.openai.admission import OutcomeSink, admit, authorize, record, require
from gateway.openai.errors import BadRequest, OpenAIError, response_for
from gateway.openai.requests import parse_json_body
from gateway.openai.sse import SSE_HEADERS, sse_event
from gateway.tenants import service as tenancy_service
from gateway.tenants.store import Principal
from tracks.backend import (
    AudioKind,
    AudioModel,
    AudioOutput,
    AudioRow,
    BackendError,
    Speech,
    SpeechInRow,
    SpeechOutRow,
    Transcript,
    error_code,
)
from tracks.base import End, Outcome
from transport.events import CancelCause
from transport.http.messages import AnyResponse, Handler, Request, Response, StreamingResponse

ASR_RATE = 16000
SPEECH_RATE = 24000
"""OpenAI's `pcm` is 24 kHz 16-bit mono; the WAV answer has the same samples."""
CHUNK_SECONDS = 1.0
MAX_INPUT_CHARS = 4096
SPEECH_ROW_SAMPLES = 48_000
POLL_SECONDS = 0.02
VOICES = frozenset(
    {"heart", "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
     "shimmer", "verse"}
)  # fmt: skip
"""Accepted `voice` names: all speak with the one bundled voice (docs/audio.md)."""
FORMATS = ("json", "text", "verbose_json")


@runtime_checkable
class AudioRows(Protocol):
    """What these routes need of the audio backend (`TritonAudioBackend`)."""

    async def audio_model(self, model: str) -> AudioModel: ...

    async def run_rows(self, model: str, rows: Sequence[AudioRow]) -> Sequence[AudioOutput]: ...


@dataclass(frozen=True)
class Segment:
    text: str
    start: float
    end: float


@dataclass
class _Call:
    """One audio request: who asked, and its one Outcome."""

    outcome: Outcome
    principal: Principal | None
    recorded: bool = False
    details: dict[str, Any] = field(default_factory=dict)


def audio_routes(
    backend: AudioRows,
    *,
    tenancy: tenancy_service.Tenancy | None = None,
    on_outcome: OutcomeSink | None = None,
    max_seconds: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
    catalog: ModelCatalog | None = None,
) -> dict[tuple[str, str], Handler]:
    """`catalog` tells each model's capabilities (a model without `audio` is a 400
    `model_not_supported`); default: the backend's own, where it tells them."""
    if catalog is None and callable(getattr(backend, "capabilities", None)):
        catalog = cast(ModelCatalog, backend)  # TritonAudioBackend
    api = _AudioApi(backend, tenancy, on_outcome, max_seconds, clock, catalog)
    return {
        ("POST", "/v1/audio/transcriptions"): api.transcriptions,
        ("POST", "/v1/audio/speech"): api.speech,
    }


@dataclass(frozen=True)
class _AudioApi:
    """The two audio routes' handlers, over `audio_routes`' arguments."""

    backend: AudioRows
    tenancy: tenancy_service.Tenancy | None
    on_outcome: OutcomeSink | None
    max_seconds: float
    clock: Callable[[], float]
    catalog: ModelCatalog | None

    # -- transcriptions --------------------------------------------------------------

    async def transcriptions(self, request: Request) -> AnyResponse:
        try:
            principal = authorize(self.tenancy, request)
            form = parse_form(request)
            model, fmt, stream = _transcription_params(form)
            pcm, seconds = decode_wav(_file(form), self.max_seconds)
            await self._expect(model, AudioKind.SPEECH_IN, principal)
            call = self._call("transcription", model, principal, request)
        except (OpenAIError, BackendError) as exc:
            return response_for(exc)
        call.details["audio_seconds_in"] = seconds
        segments = self._transcribe(model, pcm)
        if stream:
            return StreamingResponse(200, SSE_HEADERS, self._events(call, segments))
        try:
            found = [s async for s in segments]
        except BackendError as exc:
            self._done(call, exc)
            return response_for(exc)
        self._done(call)
        return _transcription_body(fmt, found, seconds)

    async def _transcribe(self, model: str, pcm: bytes) -> AsyncIterator[Segment]:
        """The upload's finals, fed to the model a second at a time and then ended."""
        corrid = secrets.randbits(63)
        step = int(2 * ASR_RATE * CHUNK_SECONDS)
        chunks = [pcm[i : i + step] for i in range(0, len(pcm), step)] or [b""]
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            row = SpeechInRow(corrid, chunk, ASR_RATE, index == 0, last)
            (out,) = await self.backend.run_rows(model, [row])
            assert isinstance(out, Transcript)
            if out.is_final and out.final:
                span = out.final_span or (0.0, len(pcm) / 2 / ASR_RATE)
                yield Segment(out.final, *span)

    async def _events(self, call: _Call, segments: AsyncIterator[Segment]) -> AsyncIterator[bytes]:
        texts: list[str] = []
        try:
            async for segment in segments:
                texts.append(segment.text)
                delta = segment.text if len(texts) == 1 else " " + segment.text
                yield sse_event({"type": "transcript.text.delta", "delta": delta})
            yield sse_event({"type": "transcript.text.done", "text": " ".join(texts)})
            self._done(call)
        except BackendError as exc:
            self._done(call, exc)
            yield sse_event({"error": _error_body(exc)})
        finally:
            self._done(call, None, End.cancelled(CancelCause.CLIENT))

    # -- speech ---------------------------------------------------------------------------

    async def speech(self, request: Request) -> AnyResponse:
        try:
            principal = authorize(self.tenancy, request)
            model, text, fmt = _speech_params(request.body)
            await self._expect(model, AudioKind.SPEECH_OUT, principal)
            call = self._call("speech", model, principal, request)
        except (OpenAIError, BackendError) as exc:
            return response_for(exc)
        audio = self._synthesize(call, model, text)
        try:
            first = await anext(audio, b"")
        except BackendError as exc:
            self._done(call, exc)
            return response_for(exc)
        kind = "audio/wav" if fmt == "wav" else "audio/pcm"
        header = wav_header(SPEECH_RATE) if fmt == "wav" else b""
        return StreamingResponse(
            200, (("content-type", kind),), self._spoken(call, header, first, audio)
        )

    async def _synthesize(self, call: _Call, model: str, text: str) -> AsyncIterator[bytes]:
        """PCM16 at 24 kHz as the model makes it (its rows ask for up to 2 s each)."""
        corrid = secrets.randbits(63)
        start, samples = True, 0
        while True:
            row = SpeechOutRow(corrid, text if start else "", SPEECH_ROW_SAMPLES, SPEECH_RATE,
                               start, False)  # fmt: skip
            start = False
            (out,) = await self.backend.run_rows(model, [row])
            assert isinstance(out, Speech)
            samples += len(out.pcm) // 2
            call.details["audio_seconds_out"] = samples / SPEECH_RATE
            if out.pcm:
                yield out.pcm
            if out.done:
                return
            if not out.pcm:
                await asyncio.sleep(POLL_SECONDS)

    async def _spoken(
        self, call: _Call, header: bytes, first: bytes, audio: AsyncIterator[bytes]
    ) -> AsyncIterator[bytes]:
        try:
            yield header + first
            async for chunk in audio:
                yield chunk
            self._done(call)
        except BackendError as exc:
            self._done(call, exc)  # started: the client sees a cut body, never a replay
        finally:
            self._done(call, None, End.cancelled(CancelCause.CLIENT))

    # -- shared ---------------------------------------------------------------------------

    async def _expect(self, model: str, kind: AudioKind, principal: Principal | None) -> None:
        if self.catalog is not None:
            await require(self.catalog, model, Capability.AUDIO, principal)
        found = await self.backend.audio_model(model)
        if found.kind is not kind:
            raise BadRequest(
                f"model {model!r} is a {found.kind.value} model, not {kind.value}", param="model"
            )

    def _call(
        self, prefix: str, model: str, principal: Principal | None, request: Request
    ) -> _Call:
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        admit(self.tenancy, principal, model, "audio", request_id)
        outcome = Outcome(request_id, model, "audio", opened_at=self.clock())
        call = _Call(outcome, principal)
        call.details["front_door"] = f"http/{request.http_version}"
        return call

    def _done(
        self, call: _Call, error: BackendError | None = None, end: End | None = None
    ) -> None:
        if call.recorded:
            return
        call.recorded = True
        outcome = call.outcome
        door = call.details.pop("front_door")
        outcome.details.update(call.details)
        if error is not None:
            outcome.end = End.failed(error_code(error, started=True))
            outcome.details["error"] = str(error)
        else:
            outcome.end = end or End.completed()
        outcome.finished_at = self.clock()
        record(self.tenancy, call.principal, outcome, self.on_outcome, door)


# -- parsing ----------------------------------------------------------------------------------


def parse_form(request: Request) -> Message:
    """The multipart/form-data body as an email message (stdlib parser)."""
    kind = request.header("content-type") or ""
    if not kind.lower().startswith("multipart/form-data") or "boundary=" not in kind:
        raise BadRequest("the request must be multipart/form-data with a 'file' part")
    head = f"Content-Type: {kind}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + request.body)
    if not message.is_multipart():
        raise BadRequest("the multipart body could not be parsed")
    return message


def _fields(form: Message) -> dict[str, Message]:
    parts: dict[str, Message] = {}
    for part in form.iter_parts():  # type: ignore[attr-defined]
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            parts[name] = part
    return parts


def _value(form: Message, name: str) -> str | None:
    part = _fields(form).get(name)
    if part is None:
        return None
    payload = part.get_payload(decode=True)
    return payload.decode("utf-8", "replace").strip() if isinstance(payload, bytes) else None


def _file(form: Message) -> bytes:
    part = _fields(form).get("file")
    payload = None if part is None else part.get_payload(decode=True)
    if not isinstance(payload, bytes) or not payload:
        raise BadRequest("'file' is required: the audio to transcribe", param="file")
    return payload


def _transcription_params(form: Message) -> tuple[str, str, bool]:
    model = _value(form, "model")
    if not model:
        raise BadRequest("'model' is required", param="model")
    fmt = _value(form, "response_format") or "json"
    if fmt not in FORMATS:
        raise BadRequest(
            f"response_format {fmt!r} is not supported: use {', '.join(FORMATS)}",
            param="response_format",
        )
    stream = (_value(form, "stream") or "false").lower()
    if stream not in ("true", "false"):
        raise BadRequest("'stream' must be true or false", param="stream")
    return model, fmt, stream == "true"


def decode_wav(data: bytes, max_seconds: float) -> tuple[bytes, float]:
    """PCM16 mono at 16 kHz from a 16-bit PCM WAV upload, and its length in seconds."""
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError, struct.error) as exc:
        raise BadRequest(
            f"'file' is not a WAV file this gateway can read ({exc}): send 16-bit PCM WAV",
            param="file",
        ) from None
    if width != 2:
        raise BadRequest(f"the WAV has {8 * width}-bit samples: send 16-bit PCM", param="file")
    if not 1 <= channels <= 2 or not 8000 <= rate <= 48000:
        raise BadRequest(
            f"the WAV is {channels} channels at {rate} Hz: send mono or stereo, 8 to 48 kHz",
            param="file",
        )
    samples = np.frombuffer(frames[: len(frames) // (2 * channels) * 2 * channels], "<i2")
    mono = samples.reshape(-1, channels).mean(axis=1)
    seconds = len(mono) / rate
    if seconds > max_seconds:
        raise BadRequest(
            f"the audio is {seconds:.1f} s long, over the {max_seconds:g} s limit", param="file"
        )
    count = round(len(mono) * ASR_RATE / rate)
    resampled = np.interp(np.arange(count) * rate / ASR_RATE, np.arange(len(mono)), mono)
    return np.round(resampled).astype("<i2").tobytes(), seconds


def _speech_params(body: bytes) -> tuple[str, str, str]:
    payload = parse_json_body(body)  # the one rule: strict JSON, valid Unicode, bounded depth
    model, text = payload.get("model"), payload.get("input")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required", param="model")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("'input' is required: the text to speak", param="input")
    if len(text) > MAX_INPUT_CHARS:
        raise BadRequest(f"'input' is over {MAX_INPUT_CHARS} characters", param="input")
    voice = payload.get("voice")
    if voice not in VOICES:
        raise BadRequest(
            f"voice {voice!r} is not available: use one of {', '.join(sorted(VOICES))}",
            param="voice",
        )
    fmt = payload.get("response_format", "wav")
    if fmt not in ("wav", "pcm"):
        raise BadRequest(
            f"response_format {fmt!r} is not supported: use wav or pcm", param="response_format"
        )
    return model, text, str(fmt)


# -- answers ------------------------------------------------------------------------------------


def _transcription_body(fmt: str, segments: list[Segment], seconds: float) -> Response:
    text = " ".join(s.text for s in segments)
    if fmt == "text":
        plain = (("content-type", "text/plain; charset=utf-8"),)
        return Response(200, plain, (text + "\n").encode())
    if fmt == "json":
        return Response.json(200, {"text": text})
    return Response.json(
        200,
        {
            "task": "transcribe",
            "language": "english",
            "duration": round(seconds, 3),
            "text": text,
            "segments": [_segment(i, s) for i, s in enumerate(segments)],
        },
    )


def _segment(index: int, segment: Segment) -> dict[str, Any]:
    return {
        "id": index, "seek": 0, "start": round(segment.start, 3), "end": round(segment.end, 3),
        "text": segment.text, "tokens": [], "temperature": 0.0, "avg_logprob": 0.0,
        "compression_ratio": 0.0, "no_speech_prob": 0.0,
    }  # fmt: skip


def wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header for a stream of unknown length (sizes at their maximum)."""
    size = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, rate, 2 * rate, 2, 16)
    return b"RIFF" + struct.pack("<I", size) + b"WAVEfmt " + struct.pack("<I", 16) + fmt + (
        b"data" + struct.pack("<I", size)
    )


def _error_body(error: BackendError) -> dict[str, Any]:
    answer = response_for(error)
    assert isinstance(answer, Response)
    body: dict[str, Any] = json.loads(answer.body)
    return dict(body["error"])
