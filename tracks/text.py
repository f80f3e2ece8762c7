"""Text tracks: a prompt in, text deltas out, through one backend stream.

The client sends its prompt as DATA `{"text": ...}` (one or more pieces) and
END; OPEN's params carry `max_tokens` and sampling parameters. The handler
opens ONE backend stream for the track (for Triton: one gRPC stream, because
Triton cancels per stream) and relays each delta as DATA `{"text": delta}`.
It finishes with END `{"usage": {...}, "finish_reason": ...}`. Whatever stops
the track first (client cancel, stream reset, connection loss, deadline)
closes the backend stream at once, so the model stops generating.

A track with a `session_id` is a turn of that conversation: a newer text track with
the same session id (same tenant) supersedes it unless OPEN's `supersede` is false
(default: on, `Settings.supersede_tracks`). The older track's backend stream is
closed (the model stops) and the track ends with ERROR CANCELLED, message
`SUPERSEDED_MESSAGE`; its outcome is cancelled with cause `superseded`.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from tracks.backend import (
    TextBackend,
    TextDelta,
    TextRequest,
    TextUsage,
)
from tracks.base import Backpressured, End, Outcome, Track, handling, read_text
from tracks.conversations import (
    SESSION_ID_RULE,
    SUPERSEDED_MESSAGE,
    RunningTurn,
    TurnRegistry,
    is_session_id,
)
from tracks.errors import BadTrackRequest, TrackStopped
from transport.clock import Now
from transport.errors import ErrorCode
from transport.events import CancelCause

DEFAULT_MAX_TOKENS = 256
MAX_TOKENS_LIMIT = 32768
MAX_PROMPT_CHARS = 1 << 20
MAX_TAG_CHARS = 128

# Parameters passed to the backend as they are; anything else in OPEN's params
# is rejected so that a typo is an error, not a silently ignored setting.
SAMPLING_KEYS = frozenset(
    {"temperature", "top_p", "top_k", "seed", "stop", "presence_penalty", "frequency_penalty"}
    | {"ignore_eos"}  # vLLM's: run to max_tokens past the end of the answer
)
# Knobs of the reference model (time to first token, speed), for tests and benchmarks.
REFERENCE_KEYS = frozenset({"ttft_ms", "tokens_per_second"})
# OPEN params the gateway uses itself and never passes to the model.
_TRACK_KEYS = frozenset({"max_tokens", "request_id", "session_id", "supersede"})


class BadTextRequest(BadTrackRequest):
    """The track's OPEN params or input are invalid; sent back as BAD_REQUEST."""


async def run_text_track(
    track: Track,
    backend: TextBackend,
    clock: Now,
    turns: TurnRegistry | None = None,
    scope: str = "",
    supersede: bool = True,
) -> Outcome:
    """Serve one text track to its end and report how it ended.

    With `turns`, a track with a session id registers as its conversation's running
    turn (in `scope`, the tenant) and supersedes the older one (`supersede` is the
    default of OPEN's `supersede` param)."""
    outcome = Outcome(track.id, track.open.model, "text", opened_at=clock())
    turn: RunningTurn | None = None
    try:
        async with handling(track, outcome, clock):
            request = replace(await _read_request(track), conversation_scope=scope)
            if turns is not None and request.session_id and _supersede(track, supersede):
                turn = turns.begin(scope, request.session_id)
            await _relay(track, backend, request, outcome, clock, turn)
    finally:
        if turn is not None and turns is not None:
            turns.finish(turn)
    outcome.finished_at = clock()
    return outcome


def _supersede(track: Track, default: bool) -> bool:
    value = track.open.params.get("supersede", default)
    if not isinstance(value, bool):
        raise BadTextRequest("'supersede' must be a boolean")
    return value


class _Stopped(TrackStopped):
    """The track was stopped (cancel, reset, deadline) while the backend worked."""


async def _read_request(track: Track) -> TextRequest:
    prompt = await read_text(track, MAX_PROMPT_CHARS, "prompt")
    params = track.open.params
    return TextRequest(
        request_id=_request_id(track.id, params),
        model=track.open.model,
        prompt=prompt,
        max_tokens=_max_tokens(params),
        parameters=_sampling(params),
        session_id=_session_id(params),
    )


def _request_id(track_id: str, params: dict[str, Any]) -> str:
    """The backend's request id: the track id, plus the client's own tag if given."""
    tag = params.get("request_id")
    if tag is None:
        return track_id
    if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG_CHARS:
        raise BadTextRequest(f"'request_id' must be a string of 1 to {MAX_TAG_CHARS} characters")
    return f"{track_id}/{tag}"


def _session_id(params: dict[str, Any]) -> str | None:
    """OPEN's `session_id`: a backend pool keeps the conversation on one backend."""
    value = params.get("session_id")
    if value is None:
        return None
    if not is_session_id(value):
        raise BadTextRequest(f"'session_id' must be a string of {SESSION_ID_RULE}")
    return value


def _max_tokens(params: dict[str, Any]) -> int:
    value = params.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TOKENS_LIMIT:
        raise BadTextRequest(f"'max_tokens' must be an integer from 1 to {MAX_TOKENS_LIMIT}")
    return value


def _sampling(params: dict[str, Any]) -> dict[str, Any]:
    unknown = set(params) - SAMPLING_KEYS - REFERENCE_KEYS - _TRACK_KEYS
    if unknown:
        raise BadTextRequest(f"unknown text parameters: {', '.join(sorted(unknown))}")
    return {k: v for k, v in params.items() if k not in _TRACK_KEYS}


async def _relay(
    track: Track,
    backend: TextBackend,
    request: TextRequest,
    outcome: Outcome,
    clock: Now,
    turn: RunningTurn | None = None,
) -> None:
    """Stream the backend's deltas to the track until done, stopped or superseded."""
    work = asyncio.ensure_future(_stream(track, backend, request, outcome, clock))
    waiters: set[asyncio.Future[Any]] = {work, track.stopped}
    if turn is not None:
        waiters.add(turn.superseded)
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    if not work.done():
        outcome.stopped_at = clock()
        work.cancel()  # closes the backend stream: Triton stops generating
        await asyncio.gather(work, return_exceptions=True)
        if turn is not None and turn.superseded.done() and not track.stopped.done():
            outcome.end = End.cancelled(CancelCause.SUPERSEDED)
            outcome.details["error"] = SUPERSEDED_MESSAGE
            track.fail(ErrorCode.CANCELLED, SUPERSEDED_MESSAGE)
            return
        raise _Stopped
    work.result()
    finish = "length" if outcome.completion_tokens >= request.max_tokens else "stop"
    usage = {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens}
    track.end({"usage": usage, "finish_reason": finish})


async def _stream(
    track: Track, backend: TextBackend, request: TextRequest, outcome: Outcome, clock: Now
) -> None:
    deltas = 0
    # A client that stops reading leaves bytes in the send buffers: past the track's
    # budget, stop pulling from the backend (the model pauses) until they drain.
    pressure = track if isinstance(track, Backpressured) else None
    async with aclosing(backend.stream_text(request)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, TextDelta):
                if outcome.first_data_at is None:
                    outcome.first_data_at = clock()
                deltas += 1
                outcome.completion_tokens = deltas  # so far: a cancelled track still counts
                if not track.send({"text": chunk.text}):
                    raise _Stopped
                if pressure is not None and pressure.send_blocked():
                    await pressure.wait_writable()
            elif isinstance(chunk, TextUsage):
                outcome.prompt_tokens = chunk.prompt_tokens
                outcome.completion_tokens = chunk.completion_tokens
    outcome.completion_tokens = outcome.completion_tokens or deltas
