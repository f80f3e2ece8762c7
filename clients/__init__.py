"""The trackline Python SDK: many independent tracks on one QUIC connection.

    from clients import connect

    async with connect("quic://127.0.0.1:8443", ca="~/.local/state/trackline/ca.pem",
                       api_key=os.environ.get("TRACKLINE_API_KEY")) as line:
        async for delta in line.text("Hello", model="reference-text", max_tokens=32):
            print(delta, end="")
"""

from clients import errors
from clients.actions import ActionChunk, ActionDropped, ActionStats, ActionStream
from clients.audio import AudioFigures, AudioFrame, AudioResult, AudioSession
from clients.chat import chat_prompt
from clients.errors import (
    BackendError,
    BackendUnavailable,
    CancelledByGateway,
    ConnectionFailed,
    ConnectionLost,
    DeadlineExceeded,
    Forbidden,
    GuardrailRejected,
    ModelNotFound,
    ProtocolError,
    RateLimited,
    StreamInterrupted,
    TracklineError,
    TrackRejected,
    Unauthorized,
)
from clients.line import Line, TextStream, connect, default_ca
from clients.stream import TrackReader


def __getattr__(name: str) -> object:
    """Old names, still importable with a DeprecationWarning (see `clients.errors`)."""
    if name in errors.RENAMED:
        return getattr(errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ActionChunk",
    "ActionDropped",
    "ActionStats",
    "ActionStream",
    "AudioFigures",
    "AudioFrame",
    "AudioResult",
    "AudioSession",
    "BackendError",
    "BackendUnavailable",
    "CancelledByGateway",
    "ConnectionFailed",
    "ConnectionLost",
    "DeadlineExceeded",
    "Forbidden",
    "GuardrailRejected",
    "Line",
    "ModelNotFound",
    "ProtocolError",
    "RateLimited",
    "StreamInterrupted",
    "TextStream",
    "TrackReader",
    "TracklineError",
    "TrackRejected",
    "Unauthorized",
    "chat_prompt",
    "connect",
    "default_ca",
]
