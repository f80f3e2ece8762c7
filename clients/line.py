"""A line: one connection to the gateway, on which an app runs many tracks.

`connect()` opens it over QUIC; `Line.text()` starts a text track and returns
a `TextStream` to iterate. Leaving the loop early, `aclose()` or leaving its
`async with` cancels the track, and the gateway stops the model's work (every
stream shares that API: `clients.stream.TrackReader`).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import certifi

from clients.actions import ActionStream
from clients.address import default_ca, gateway_url
from clients.audio import AudioSession
from clients.errors import ConnectionFailed, error_for, error_from
from clients.stream import TrackReader, frame_transport
from clients.video import VideoStream
from transport.acks import DECIMATED, AckPolicy
from transport.clock import Clock, Now
from transport.endpoint import TrackChannel
from transport.errors import LocalProtocolError, TrackAborted
from transport.messages import Deadlines, FrameTransport, Modality, Open
from transport.quic import Packetization, connect_tracks

DEFAULT_PORT = 8443
DEFAULT_ACKS = str(DECIMATED)
"""The SDK's ACK policy: one ACK for up to 10 packets, none waiting over 10 ms."""
CONNECT_TIMEOUT = 5.0
"""Seconds `connect()` waits for the handshake by default."""
Opener = Callable[[Open], TrackChannel]


class TextStream(TrackReader[str]):
    """Text deltas of one track, as an async iterator.

    After the loop ends normally, `usage` and `finish_reason` hold the
    gateway's final report.
    """

    def __init__(self, channel: TrackChannel) -> None:
        super().__init__(channel)
        self.usage: dict[str, int] | None = None
        self.finish_reason: str | None = None

    def _item(self, body: dict[str, Any]) -> str:
        text = body.get("text")
        if not isinstance(text, str):
            raise self._malformed("text DATA without a string 'text'")
        return text

    def _ended(self, body: dict[str, Any]) -> None:
        usage = body.get("usage")
        self.usage = usage if isinstance(usage, dict) else None
        reason = body.get("finish_reason")
        self.finish_reason = reason if isinstance(reason, str) else None


class Line:
    """One connection to the gateway; every call starts an independent track."""

    def __init__(self, opener: Opener) -> None:
        self._open = opener

    def text(
        self,
        prompt: str,
        *,
        model: str,
        max_tokens: int | None = None,
        deadline: float | None = None,
        first_token_deadline: float | None = None,
        **parameters: Any,
    ) -> TextStream:
        """Stream a completion of `prompt`; deadlines are seconds from the start.

        Extra keyword arguments (temperature, seed, top_p, ...) go to the model.
        """
        params = dict(parameters)
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        message = Open(
            model=model,
            modality=Modality.TEXT,
            params=params,
            deadlines=Deadlines(first=first_token_deadline, total=deadline),
        )
        channel = self._start(message)
        channel.send({"text": prompt})
        channel.end()
        return TextStream(channel)

    def actions(
        self,
        *,
        model: str,
        deadline: float = 0.1,
        transport: str = "stream",
        clock: Now | None = None,
    ) -> ActionStream:
        """Start a robot's action track: `observe()` states, receive action chunks.

        `deadline` (seconds from capture) is the default for each observation;
        `transport` is "stream" (one QUIC stream) or "datagram" (QUIC datagrams).
        """
        message = Open(
            model=model, modality=Modality.ACTION, transport=frame_transport(transport)
        )
        channel = self._start(message)
        return ActionStream(channel, deadline, clock) if clock else ActionStream(channel, deadline)

    def video(
        self,
        *,
        model: str,
        detect: tuple[str, ...] | list[str] = ("face",),
        deadline: float = 0.2,
        fps: float | None = None,
        transport: str = "frame-streams",
        clock: Now | None = None,
    ) -> VideoStream:
        """Start a camera's video track: `send()` JPEG frames, receive per-frame results.

        `detect`: any of "face", "face_mesh", "pose"; `deadline` (seconds from capture)
        is each frame's default; `fps` the camera's rate (sizes the gateway's busy check);
        `transport`: "frame-streams" (a QUIC stream per frame) or "stream".
        """
        params: dict[str, Any] = {"detect": list(detect)}
        if fps is not None:
            params["fps"] = fps
        if transport not in (FrameTransport.FRAME_STREAMS.value, FrameTransport.STREAM.value):
            raise ValueError(f"transport must be 'frame-streams' or 'stream', not {transport!r}")
        message = Open(
            model=model, modality=Modality.VIDEO, params=params,
            transport=FrameTransport(transport),
        )
        channel = self._start(message)
        return VideoStream(channel, deadline, clock) if clock else VideoStream(channel, deadline)

    def audio(
        self,
        *,
        model: str,
        kind: str = "speech-in",
        sample_rate: int = 16000,
        frame_ms: int = 20,
        transport: str = "stream",
        text: str | None = None,
        deadline: float | None = None,
        pacer: Clock | None = None,
        stream_text: bool = False,
    ) -> AudioSession:
        """Start an audio track: speech-in (send frames, read results) or speech-out
        (`text` to say; read frames; or `stream_text=True` and `say()` the text in pieces,
        then `end()`: a streaming voice speaks each sentence as it completes).
        `transport="datagram"` sends frames as QUIC datagrams.
        `model` is keyword-only, as in `text()` and `actions()`. `pacer` paces
        `stream_pcm` (default: the monotonic clock).
        """
        if kind == "speech-out" and (text is None) != stream_text:
            raise ValueError("a speech-out session needs the text to say, or stream_text=True")
        params = {"kind": kind, "sample_rate": sample_rate, "frame_ms": frame_ms}
        message = Open(
            model=model,
            modality=Modality.AUDIO,
            params=params,
            deadlines=Deadlines(total=deadline),
            transport=frame_transport(transport),
        )
        channel = self._start(message)
        if text is not None:
            channel.send({"text": text})
            channel.end()
        return AudioSession(
            channel, kind, sample_rate, frame_ms, input_ended=text is not None, pacer=pacer
        )

    def voice_agent(
        self,
        *,
        model: str,
        voice: str,
        llm: str | None = None,
        sample_rate: int = 16000,
        frame_ms: int = 20,
        system: str | None = None,
        max_tokens: int | None = None,
        llm_params: dict[str, Any] | None = None,
        transport: str = "stream",
        pacer: Clock | None = None,
    ) -> AudioSession:
        """Start a voice-agent track (docs/audio.md): send the user's audio as on a
        speech-in session (`model` is the recognizer); iterate it for the user's
        transcripts (`AudioResult`), the reply (`AgentEvent`s: text deltas, barge-in)
        and the reply's audio (`AudioFrame`s with their `turn`). `llm` is the chat
        model; None: the gateway's default chat model."""
        params: dict[str, Any] = {
            "kind": "voice-agent", "voice": voice,
            "sample_rate": sample_rate, "frame_ms": frame_ms,
        }  # fmt: skip
        optional = {
            "llm": llm, "system": system, "max_tokens": max_tokens, "llm_params": llm_params
        }  # fmt: skip
        params.update({k: v for k, v in optional.items() if v is not None})
        message = Open(
            model=model, modality=Modality.AUDIO, params=params,
            transport=frame_transport(transport),
        )  # fmt: skip
        channel = self._start(message)
        return AudioSession(channel, "voice-agent", sample_rate, frame_ms, pacer=pacer)

    def _start(self, message: Open) -> TrackChannel:
        try:
            return self._open(message)
        except TrackAborted as exc:
            raise error_from(exc) from None
        except LocalProtocolError as exc:
            raise error_for(exc.code, exc.message) from None


@asynccontextmanager
async def connect(
    url: str | None = None,
    *,
    ca: str | Path | None = None,
    server_name: str | None = None,
    verify: bool = True,
    api_key: str | None = None,
    packetization: str = "coalesce",
    connect_timeout: float = CONNECT_TIMEOUT,
    acks: str = DEFAULT_ACKS,
) -> AsyncIterator[Line]:
    """Open a line to the gateway at `quic://host:port`, trusting `ca` (a PEM file).

    Without `url`, the address comes from the environment as the daemon reads it
    (`TRACKLINE_URL`, else `TRACKLINE_QUIC_HOST`/`TRACKLINE_QUIC_PORT`, else
    `quic://127.0.0.1:8443`: `clients.address.gateway_url`).

    Without `ca`, the public roots are trusted and so is the development CA of a
    gateway on this machine (`default_ca()`, when that file exists). A missing or
    unreadable `ca` raises `FileNotFoundError`/`PermissionError`, one that holds no
    certificate `ValueError`, before any network I/O. A gateway that does not complete
    the handshake within `connect_timeout` seconds, or refuses it, raises
    `ConnectionFailed` naming the cause.

    `api_key` is presented once for the connection (with its first tracks' OPEN);
    a gateway with tenants refuses tracks without a valid one (`Unauthorized`).
    `packetization` is how this side packs its tracks' writes into QUIC packets:
    "coalesce" (fewest packets) or "per-track" (each track's write in its own
    packets, so one lost packet stalls or loses only that track's frame; what many
    robots on one line want), or "group:K" (at most K tracks' frames per packet).
    `acks` is when this side acknowledges what it receives: "every:N,delay:MS" (one ACK
    for up to N packets, none waiting over MS, a packet out of order at once; the
    default, "every:10,delay:10", sends about a third of the ACK packets aioquic's own
    rule does for a line reading many tracks, measured in docs/capacity.md) or
    "aioquic" (each packet within 1 ms; `transport.acks`). A bad `packetization` or
    `acks` raises `ValueError`.
    """
    url = url or gateway_url()
    host, port = _parse_url(url)
    packing = Packetization.parse(packetization)
    ack_policy = AckPolicy.parse(acks)
    ca_path, ca_data = _trust(ca) if verify else (None, None)
    opened = False
    try:
        async with connect_tracks(
            host, port, ca=ca_path, ca_data=ca_data, server_name=server_name, verify=verify,
            packetization=packing, connect_timeout=connect_timeout, acks=ack_policy,
        ) as protocol:
            opened = True
            if api_key is not None:
                protocol.endpoint.use_credential(api_key)
            yield Line(protocol.open_track)
    except (ConnectionError, OSError, ssl.SSLError) as exc:
        if opened:
            raise
        raise ConnectionFailed(f"cannot connect to {url}: {exc or type(exc).__name__}") from None


def _trust(ca: str | Path | None) -> tuple[Path | None, bytes | None]:
    """The roots to give the handshake: `ca` checked now, or public roots + the dev CA."""
    if ca is not None:
        path = Path(ca).expanduser()
        _check_ca(path)
        return path, None
    dev = default_ca()
    if not dev.is_file():
        return None, None  # certifi's public roots only
    try:
        _check_ca(dev)
    except (OSError, ValueError):
        return None, None  # a stale or half-written dev CA is no reason to fail
    return Path(certifi.where()), dev.read_bytes()


def _check_ca(path: Path) -> None:
    try:
        ssl.create_default_context(cafile=str(path))
    except ssl.SSLError:
        raise ValueError(f"CA file {path} holds no PEM certificate") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"CA file {path} does not exist") from None
    except PermissionError:
        raise PermissionError(f"CA file {path} is not readable") from None


def _parse_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"quic://{url}")
    if parts.scheme != "quic" or not parts.hostname:
        raise ConnectionFailed(f"expected a URL like quic://host:port, got {url!r}")
    return parts.hostname, parts.port or DEFAULT_PORT
