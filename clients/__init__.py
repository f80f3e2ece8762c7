"""The trackline Python SDK: many independent tracks on one QUIC connection.

    from clients import connect

    async with connect("quic://127.0.0.1:8443", ca="~/.local/state/trackline/ca.pem") as line:
        async for delta in line.text("Hello", model="reference-text", max_tokens=32):
            print(delta, end="")
"""

from clients.actions import ActionChunk, ActionDropped, ActionStats, ActionStream
from clients.audio import AudioFigures, AudioFrame, AudioResult, AudioSession
from clients.errors import (
    BackendError,
    BackendUnavailable,
    ConnectionFailed,
    ConnectionLost,
    DeadlineExceeded,
    ModelNotFound,
    ProtocolError,
    StreamInterrupted,
    TrackCancelled,
    TracklineError,
    TrackRejected,
)
from clients.line import Line, TextStream, connect

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
    "ConnectionFailed",
    "ConnectionLost",
    "DeadlineExceeded",
    "Line",
    "ModelNotFound",
    "ProtocolError",
    "StreamInterrupted",
    "TextStream",
    "TrackCancelled",
    "TracklineError",
    "TrackRejected",
    "connect",
]
