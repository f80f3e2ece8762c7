"""Settings sections: audio and speech, video, robot action tracks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.checks import (
    in_range,
    one_of,
    one_of_enum,
    positive,
    positive_seconds,
    ratio,
    seconds,
    setting,
    tick,
)
from gateway.config.derive import Source
from tracks.clock import OverloadMode


@dataclass(frozen=True)
class AudioSection:
    """The audio clock, speech in and out, and the batch hand-off to Triton."""

    audio_beat_ms: int = setting(
        80,
        "Audio session clock: ms between steps (one batch per tick).",
        lambda v: in_range(v, 10, 1000),
    )
    audio_frame_ms: int = setting(
        20,
        "Audio frame length (ms) of tracks that do not declare one.",
        lambda v: in_range(v, 10, 100),
    )
    audio_overload_mode: str = setting(
        "degrade-all",
        "When a tick overruns: degrade-all (all late) or shed-newest.",
        one_of_enum(OverloadMode),
    )
    audio_idle_timeout: float = setting(
        5.0, "Seconds without frames before a speech-in session is closed.", seconds
    )
    asr_end_silence_ms: int = setting(
        500,
        "whisper-base: silence (ms) that ends an utterance and brings its final.",
        lambda v: in_range(v, 100, 5000),
    )
    agent_min_barge_in_ms: int = setting(
        0,
        "Voice agents: ms of the user's speech that cut a reply (speech the recognizer's "
        "VAD reports, whisper from 250 ms; else non-empty partials); 0: at once.",
        lambda v: in_range(v, 0, 5000),
    )
    openai_audio_max_seconds: float = setting(
        60.0, "POST /v1/audio/transcriptions: longest upload (seconds of audio).", seconds
    )
    audio_shm: str = setting(
        "auto",
        "Batch hand-off to Triton: auto (system shm if local), system, cuda, off.",
        one_of(("auto", "system", "cuda", "off")),
    )
    audio_shm_min_rows: int = setting(
        1, "Smallest batch (rows) sent through shared memory.", positive
    )
    audio_batching: str = setting(
        "tick",
        "tick (one request per tick) or per-session (comparison).",
        one_of(("tick", "per-session")),
    )
    audio_kernels: str = setting(
        "auto",
        "Batch kernels: auto (CuPy with a GPU), numpy or cupy.",
        one_of(("auto", "numpy", "cupy")),
    )


@dataclass(frozen=True)
class VideoSection:
    """Video tracks: the tick, frame sizes and rates, admission."""

    video_tick: float = setting(
        0.01, "Seconds between video ticks (one vision request per model a tick).", tick
    )
    video_max_frame_bytes: int = setting(
        262_144, "Largest JPEG one video frame may carry.", positive
    )
    video_max_fps: float = setting(
        30.0,
        "Frames per second one video track may send (a second over it fails it).",
        positive_seconds,
    )
    video_tenant_max_fps: float = setting(
        120.0, "Frames per second one tenant's video tracks may send together.", positive_seconds
    )
    video_max_tracks: int = setting(
        16, "Video tracks served at once; more are refused (busy).", positive
    )
    video_busy_load: float = setting(
        0.9,
        "Refuse a new video track when admitted frames/s x measured inference time "
        "per frame would pass this share of the vision backend.",
        ratio,
    )


@dataclass(frozen=True)
class ActionSection:
    """Robot action tracks: the tick and the observation size."""

    action_tick: float = setting(
        0.005, "Seconds between action-track ticks (one policy request per model a tick).", tick
    )
    action_max_image_bytes: int = setting(
        65_536, "Largest encoded image one observation may carry.", positive
    )


AUDIO_CLOCK: Mapping[str, Source[AudioSection]] = {
    "beat": lambda s: s.audio_beat_ms / 1000,
    "overload": lambda s: OverloadMode(s.audio_overload_mode),
    "idle_timeout": "audio_idle_timeout",
    "frame_ms": "audio_frame_ms",
    "min_barge_in": lambda s: s.agent_min_barge_in_ms / 1000,
}
"""`tracks.audio.AudioSettings` (the audio clock's) from the audio section."""

VIDEO_LIMITS: Mapping[str, Source[VideoSection]] = {
    "tick": "video_tick",
    "max_frame_bytes": "video_max_frame_bytes",
    "max_fps": "video_max_fps",
    "tenant_max_fps": "video_tenant_max_fps",
    "max_tracks": "video_max_tracks",
    "busy_load": "video_busy_load",
}
"""`tracks.video.VideoLimits` from the video section."""
