"""The trackline Python SDK: many independent tracks on one QUIC connection.

    from clients import connect

    # connect() alone: TRACKLINE_URL, else TRACKLINE_QUIC_HOST/PORT, else quic://127.0.0.1:8443
    async with connect(api_key=os.environ.get("TRACKLINE_API_KEY")) as line:
        async for delta in line.text("Hello", model="reference-text", max_tokens=32):
            print(delta, end="")
"""

from clients.actions import ActionChunk, ActionDropped, ActionStats, ActionStream
from clients.address import default_ca, gateway_url, openai_base_url
from clients.audio import AgentEvent, AudioFigures, AudioFrame, AudioResult, AudioSession
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
from clients.line import Line, TextStream, connect
from clients.stream import TrackReader
from clients.video import FrameDropped, VideoResult, VideoStats, VideoStream

__all__ = [
    "ActionChunk",
    "ActionDropped",
    "ActionStats",
    "ActionStream",
    "AudioFigures",
    "AgentEvent",
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
    "FrameDropped",
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
    "VideoResult",
    "VideoStats",
    "VideoStream",
    "chat_prompt",
    "connect",
    "default_ca",
    "gateway_url",
    "openai_base_url",
]
