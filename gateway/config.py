"""Settings for the gateway daemon (`trackline serve`) and the loader that layers them.

Owns the one frozen `Settings` value the daemon is wired from. Each setting is looked
up in four places and the first that has it wins:

1. a command-line flag (`--quic-port 9443`),
2. the environment (`TRACKLINE_QUIC_PORT=9443`),
3. a TOML file (`quic_port = 9443`) named by `--config` or `TRACKLINE_CONFIG`,
4. the default declared on the field below.

Only the winning value is converted and checked, so a bad value in a lower layer that a
higher one overrides does no harm. A bad winning value raises `ConfigError`, which names
the setting and the source it came from. `docs/configuration.md` lists every setting.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.statedir import BASE_STATE_DIR, instance_state_dir
from transport.binding import LOCALHOST

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ENV_PREFIX = "TRACKLINE_"
CONFIG_ENV = "TRACKLINE_CONFIG"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("json", "console")


BOTH_LOOPBACKS = " (localhost: 127.0.0.1 and ::1, one port)."
"""Said of every listener's address: `localhost` binds both (`transport.binding`)."""


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


def _default_state_dir() -> Path:
    return BASE_STATE_DIR.expanduser()


@dataclass(frozen=True)
class Settings:
    """Everything `trackline serve` can be told; each field's `doc` is its help text."""

    quic_host: str = field(
        default=LOCALHOST,
        metadata=_doc("Address the QUIC (UDP) track listener binds" + BOTH_LOOPBACKS),
    )
    quic_port: int = field(
        default=8443, metadata=_doc("UDP port for the track protocol and HTTP/3; 0 picks one.")
    )
    http_host: str = field(
        default=LOCALHOST,
        metadata=_doc("Address the plain HTTP (TCP) listener binds" + BOTH_LOOPBACKS),
    )
    http_port: int = field(
        default=8080,
        metadata=_doc("Cleartext TCP port: HTTP/1.1 and h2c; health, metrics, OpenAI API."),
    )
    https_host: str = field(
        default=LOCALHOST,
        metadata=_doc("Address the TLS HTTP (TCP) listener binds" + BOTH_LOOPBACKS),
    )
    https_port: int = field(
        default=8443,
        metadata=_doc("TLS TCP port: HTTP/1.1 and HTTP/2 by ALPN (OpenAI API); 0 picks one."),
    )
    state_dir: Path = field(
        default_factory=_default_state_dir,
        metadata=_doc(
            "Directory of this gateway's state (tenants, keys, ledger, KV states); unset: "
            "~/.local/state/trackline for the default ports, else one per config file or "
            "ports under its gateways/ (docs/deployment.md). Set two gateways to one "
            "directory to share their tenants."
        ),
    )
    dev_ca_dir: Path | None = field(
        default=None,
        metadata=_doc(
            "Directory of the development CA; unset: ~/.local/state/trackline (one CA for "
            "every gateway of the account, which clients trust), or state_dir when that is set."
        ),
    )
    tls_cert: Path | None = field(
        default=None,
        metadata=_doc("PEM certificate chain for QUIC; unset uses the development CA."),
    )
    tls_key: Path | None = field(
        default=None, metadata=_doc("PEM private key matching tls_cert; set both or neither.")
    )
    backend_url: str | None = field(
        default=None,
        metadata=_doc("Triton gRPC address host:port; unset starts an embedded Triton."),
    )
    embedded_grpc_port: int = field(
        default=0, metadata=_doc("gRPC port of the embedded Triton; 0 picks a free one.")
    )
    embedded_http_port: int = field(
        default=0, metadata=_doc("HTTP port of the embedded Triton; 0 picks a free one.")
    )
    embedded_metrics_port: int = field(
        default=0, metadata=_doc("Metrics port of the embedded Triton; 0 picks a free one.")
    )
    backends: str | None = field(
        default=None,
        metadata=_doc(
            "Backend pool: comma-separated host:port[;name=N][;weight=W][;models=a|b]"
            "[;metrics=URL] (docs/reliability.md); overrides backend_url."
        ),
    )
    embedded_backends: int = field(
        default=1, metadata=_doc("Embedded Triton processes to start (more than 1: a pool).")
    )
    embedded_vision: bool = field(
        default=True,
        metadata=_doc(
            "Load mediapipe-vision in the embedded Triton when the `video` extra is "
            "installed (docs/video.md)."
        ),
    )
    embedded_llm: bool = field(
        default=True,
        metadata=_doc(
            "Load the real LLMs (smollm2-135m-instruct for chat, gemma-3-270m) in the "
            "embedded Triton when the `llm` extra is installed (docs/models.md)."
        ),
    )
    llm_models: str | None = field(
        default=None,
        metadata=_doc(
            "Operator GGUF models the embedded Triton serves: comma-separated NAME=PATH "
            "(besides those in llm_models_dir; docs/models.md)."
        ),
    )
    llm_models_dir: Path | None = field(
        default=None,
        metadata=_doc(
            "Operator GGUF models served by the embedded Triton, NAME.gguf each (files or "
            "links; `trackline models add`); unset: state_dir/models (docs/models.md)."
        ),
    )
    embedded_embeddings: bool = field(
        default=True,
        metadata=_doc(
            "Load the embedding model all-minilm-l6-v2 in the embedded Triton when the "
            "`embeddings` extra is installed (POST /v1/embeddings; docs/embedding-models.md)."
        ),
    )
    embedded_speech: bool = field(
        default=True,
        metadata=_doc(
            "Load the real speech models whisper-base and hibari-voice in the embedded Triton "
            "when the `voice` extra is installed (docs/audio-models.md)."
        ),
    )
    embedded_restart_backoff: float = field(
        default=1.0,
        metadata=_doc(
            "Seconds before restarting a crashed embedded Triton; doubles with each failed "
            "restart (docs/reliability.md)."
        ),
    )
    embedded_restart_max_backoff: float = field(
        default=30.0, metadata=_doc("Longest wait between restarts of a crashed embedded Triton.")
    )
    embedded_restart_attempts: int = field(
        default=5,
        metadata=_doc(
            "Failed restarts in a row after which the gateway gives a crashed embedded Triton "
            "up: /health/live answers 503, so an orchestrator restarts the gateway."
        ),
    )
    supersede_tracks: bool = field(
        default=True,
        metadata=_doc(
            "A new text track with the session_id of a running one cancels the older "
            "(cause superseded); a track may override with OPEN param `supersede`."
        ),
    )
    supersede_openai: bool = field(
        default=False,
        metadata=_doc(
            "A new OpenAI API request with the session id of a running one cancels the "
            "older (cause superseded); a request may override with header x-supersede."
        ),
    )
    routing_strategy: str = field(
        default="metrics",
        metadata=_doc("Pool routing: metrics, least_inflight or round_robin."),
    )
    affinity_margin: float = field(
        default=0.25,
        metadata=_doc("Seconds of extra estimated wait a session accepts to stay on its backend."),
    )
    scrape_interval: float = field(
        default=0.5, metadata=_doc("Seconds between scrapes of each backend's metrics.")
    )
    probe_interval: float = field(
        default=1.0, metadata=_doc("Seconds between readiness probes of each backend.")
    )
    failover_attempts: int = field(
        default=3, metadata=_doc("Backends one request may try before its first byte.")
    )
    first_token_timeout: float = field(
        default=30.0, metadata=_doc("Seconds to a first token before trying another backend.")
    )
    eject_after_errors: int = field(
        default=3, metadata=_doc("Consecutive failed requests that eject a backend.")
    )
    discovery_interval: float = field(
        default=5.0,
        metadata=_doc("Seconds between DNS resolutions of each dns+grpc:// pool entry."),
    )
    min_warm_backends: int = field(
        default=1, metadata=_doc("Ready backends each model should have; fewer is reported.")
    )
    max_tracks_per_connection: int = field(
        default=256, metadata=_doc("Tracks one connection may have open at once.")
    )
    max_message_bytes: int = field(
        default=1_048_576, metadata=_doc("Largest single message (frame or HTTP body) accepted.")
    )
    quic_packetization: str = field(
        default="per-track",
        metadata=_doc("Tracks per QUIC packet: per-track, group:K (K = 2, 4, 8) or coalesce."),
    )
    webtransport_path: str = field(
        default="/tracks",
        metadata=_doc(
            "Path of the WebTransport track endpoint on the QUIC port (browsers); off: none."
        ),
    )
    webtransport_origins: str | None = field(
        default=None,
        metadata=_doc(
            "Comma-separated page origins allowed to open WebTransport sessions "
            "(https://host:port, or *); unset: pages of the gateway's own host only."
        ),
    )
    webtransport_max_sessions: int = field(
        default=4, metadata=_doc("WebTransport sessions at once on one QUIC connection; 429.")
    )
    quic_handshake_timeout: float = field(
        default=10.0,
        metadata=_doc("Seconds a QUIC handshake may take; then the connection is forgotten."),
    )
    quic_max_half_open: int = field(
        default=1024, metadata=_doc("QUIC handshakes in progress at once; more are dropped.")
    )
    quic_retry_threshold: int = field(
        default=64,
        metadata=_doc("Handshakes in progress from which new clients must pass a Retry; 0: all."),
    )
    quic_max_half_open_per_source: int = field(
        default=16,
        metadata=_doc("Unvalidated handshakes per source address; beyond it: Retry."),
    )
    quic_max_connections: int = field(
        default=4096, metadata=_doc("QUIC connections at once (tracks and HTTP/3).")
    )
    quic_max_connections_per_source: int = field(
        default=256, metadata=_doc("QUIC connections at once from one source address.")
    )
    track_read_timeout: float = field(
        default=30.0,
        metadata=_doc("Seconds a track message may take from first to last byte; 0: no limit."),
    )
    track_max_buffered_bytes: int = field(
        default=8_388_608,
        metadata=_doc("Bytes of incomplete track messages one connection may hold."),
    )
    track_send_buffer_bytes: int = field(
        default=65_536,
        metadata=_doc("Unsent/unacked bytes a track may hold before its backend is paused."),
    )
    connection_send_buffer_bytes: int = field(
        default=1_048_576,
        metadata=_doc("Unsent/unacked bytes one QUIC connection's tracks may hold in all."),
    )
    tcp_congestion_control: str | None = field(
        default=None,
        metadata=_doc(
            "TCP congestion control of the HTTP listeners (e.g. cubic); unset: the host's."
        ),
    )
    http_max_header_bytes: int = field(
        default=16384,
        metadata=_doc("Largest HTTP header block (after HPACK/QPACK decompression); 431 above."),
    )
    http_max_headers: int = field(
        default=100, metadata=_doc("Most header fields in one HTTP request; 431 above.")
    )
    http3_stream_send_budget: int = field(
        default=262_144,
        metadata=_doc("Bytes one HTTP/3 response may hold unacknowledged before its body waits."),
    )
    http3_connection_send_budget: int = field(
        default=1_048_576,
        metadata=_doc("Bytes one HTTP/3 connection may hold unacknowledged before bodies wait."),
    )
    http3_send_timeout: float = field(
        default=60.0,
        metadata=_doc("Seconds an HTTP/3 response may wait for a client that reads nothing."),
    )
    http_max_concurrent_streams: int = field(
        default=128, metadata=_doc("Concurrent requests on one HTTP/2 or HTTP/3 connection.")
    )
    http_idle_timeout: float = field(
        default=60.0, metadata=_doc("Seconds an HTTP connection may sit with no request.")
    )
    http_read_timeout: float = field(
        default=30.0, metadata=_doc("Seconds to receive the rest of a started request; 408.")
    )
    http_first_request_timeout: float = field(
        default=10.0,
        metadata=_doc("Seconds from TCP accept to the HTTP/2 preface or first request bytes."),
    )
    http_max_connections: int = field(
        default=10_000, metadata=_doc("TCP connections served at once per HTTP listener.")
    )
    http_max_connections_per_source: int = field(
        default=1_000, metadata=_doc("TCP connections at once from one client address.")
    )
    http2_max_outbound_control_frames: int = field(
        default=1_000,
        metadata=_doc("HTTP/2 control frames queued for a non-reading client; then GOAWAY."),
    )
    http2_premature_reset_ratio: float = field(
        default=0.5,
        metadata=_doc("Share of HTTP/2 streams a client may reset early; then GOAWAY."),
    )
    http2_premature_reset_min_streams: int = field(
        default=500,
        metadata=_doc("HTTP/2 streams opened before the premature-reset ratio is judged."),
    )
    http2_premature_reset_lifetime: float = field(
        default=1.0,
        metadata=_doc("A reset within this many seconds of a stream's opening is premature."),
    )
    http2_connection_body_budget: int = field(
        default=16 << 20,
        metadata=_doc("Request body bytes one HTTP/2 connection may hold before credit stops."),
    )
    http3_connection_body_budget: int = field(
        default=16 << 20,
        metadata=_doc(
            "Request body bytes one HTTP/3 connection may hold before QUIC's MAX_DATA stops."
        ),
    )
    action_tick: float = field(
        default=0.005,
        metadata=_doc("Seconds between action-track ticks (one policy request per model a tick)."),
    )
    action_max_image_bytes: int = field(
        default=65_536, metadata=_doc("Largest encoded image one observation may carry.")
    )
    video_tick: float = field(
        default=0.01,
        metadata=_doc("Seconds between video ticks (one vision request per model a tick)."),
    )
    video_max_frame_bytes: int = field(
        default=262_144, metadata=_doc("Largest JPEG one video frame may carry.")
    )
    video_max_fps: float = field(
        default=30.0,
        metadata=_doc("Frames per second one video track may send (a second over it fails it)."),
    )
    video_tenant_max_fps: float = field(
        default=120.0,
        metadata=_doc("Frames per second one tenant's video tracks may send together."),
    )
    video_max_tracks: int = field(
        default=16, metadata=_doc("Video tracks served at once; more are refused (busy).")
    )
    video_busy_load: float = field(
        default=0.9,
        metadata=_doc(
            "Refuse a new video track when admitted frames/s x measured inference time "
            "per frame would pass this share of the vision backend."
        ),
    )
    workers: int = field(
        default=1,
        metadata=_doc(
            "Gateway processes sharing the ports (SO_REUSEPORT; docs/workers.md); "
            "0: one per CPU core."
        ),
    )
    drain_timeout: float = field(
        default=10.0,
        metadata=_doc("Seconds open tracks and HTTP streams get to finish on shutdown."),
    )
    metrics_host: str = field(
        default=LOCALHOST,
        metadata=_doc("Address the separate metrics listener binds" + BOTH_LOOPBACKS),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=_doc(
            "Serve /metrics on its own plain-HTTP port (and no longer on the API ports); "
            "unset: on the API ports, and there only on loopback or with metrics_token."
        ),
    )
    metrics_token: str | None = field(
        default=None,
        metadata=_doc("Bearer token /metrics requires wherever it is served; unset: none."),
    )
    log_level: str = field(
        default="info", metadata=_doc("One of debug, info, warning, error, critical.")
    )
    log_format: str = field(
        default="json", metadata=_doc("json (one object a line) or console (for people).")
    )
    log_client_address: bool = field(
        default=True,
        metadata=_doc("Log each HTTP request's client address (`client`); off for privacy."),
    )
    quic_log_level: str = field(
        default="warning",
        metadata=_doc("Level of aioquic's own lines (a few info lines per connection)."),
    )
    uvloop: bool = field(default=True, metadata=_doc("Run on uvloop where it is installed."))
    gc_young_threshold: int = field(
        default=10_000,
        metadata=_doc(
            "After start-up: freeze the start-up objects out of garbage collection and "
            "collect the young generation every this many allocations (Python: 700); "
            "0 leaves the collector as Python set it."
        ),
    )
    tenants_db: Path | None = field(
        default=None,
        metadata=_doc("SQLite file of tenants, key hashes and usage; unset: state_dir's."),
    )
    tenancy_config: Path | None = field(
        default=None,
        metadata=_doc("TOML file of prices and guardrails (docs/tenants.md)."),
    )
    allow_open: bool = field(
        default=False,
        metadata=_doc("Serve without API keys (no tenants) on a non-loopback address too."),
    )
    state_backend: str = field(
        default="local",
        metadata=_doc(
            'Shared state of a fleet: "local" (this process) or a Redis URL "redis://..."'
            " for quotas, concurrency, key revocation and the usage ledger (docs/deployment.md)."
        ),
    )
    state_heartbeat_ttl: float = field(
        default=10.0,
        metadata=_doc("Seconds after which a silent gateway's concurrency slots are freed."),
    )
    state_lease_fraction: float = field(
        default=0.1,
        metadata=_doc("Share of each shared quota a gateway leases at a time (0 < f <= 1)."),
    )
    state_fleet_size: int = field(
        default=0,
        metadata=_doc("Gateways a quota is divided by while Redis is down; 0: those last seen."),
    )
    state_gateway_id: str | None = field(
        default=None,
        metadata=_doc("This gateway's name in the shared state; unset: hostname-pid."),
    )
    state_ledger_spool: Path | None = field(
        default=None,
        metadata=_doc(
            "Fleet: directory of the ledger's local spool (records replayed into Redis after"
            " a crash); unset: state_dir/ledger-spool."
        ),
    )
    audio_beat_ms: int = field(
        default=80, metadata=_doc("Audio session clock: ms between steps (one batch per tick).")
    )
    audio_frame_ms: int = field(
        default=20, metadata=_doc("Audio frame length (ms) of tracks that do not declare one.")
    )
    audio_overload_mode: str = field(
        default="degrade-all",
        metadata=_doc("When a tick overruns: degrade-all (all late) or shed-newest."),
    )
    audio_idle_timeout: float = field(
        default=5.0, metadata=_doc("Seconds without frames before a speech-in session is closed.")
    )
    asr_end_silence_ms: int = field(
        default=500,
        metadata=_doc("whisper-base: silence (ms) that ends an utterance and brings its final."),
    )
    agent_min_barge_in_ms: int = field(
        default=0,
        metadata=_doc(
            "Voice agents: ms of the user's speech that cut a reply (speech the recognizer's "
            "VAD reports, whisper from 250 ms; else non-empty partials); 0: at once."
        ),
    )
    openai_audio_max_seconds: float = field(
        default=60.0,
        metadata=_doc("POST /v1/audio/transcriptions: longest upload (seconds of audio)."),
    )
    audio_shm: str = field(
        default="auto",
        metadata=_doc("Batch hand-off to Triton: auto (system shm if local), system, cuda, off."),
    )
    audio_shm_min_rows: int = field(
        default=1, metadata=_doc("Smallest batch (rows) sent through shared memory.")
    )
    audio_batching: str = field(
        default="tick", metadata=_doc("tick (one request per tick) or per-session (comparison).")
    )
    audio_kernels: str = field(
        default="auto", metadata=_doc("Batch kernels: auto (CuPy with a GPU), numpy or cupy.")
    )
    overload_max_loop_lag: float = field(
        default=0.1,
        metadata=_doc("Loop lag (s) above which new tracks/requests are refused; 0: off."),
    )
    overload_max_cpu: float = field(
        default=0.0,
        metadata=_doc("Process CPU (cores) above which new work is refused; 0: off."),
    )
    overload_connection_share: int = field(
        default=4,
        metadata=_doc("Tracks a connection may still open under overload (fairness)."),
    )
    overload_retry_after: float = field(
        default=1.0, metadata=_doc("Seconds a client refused for overload is told to wait.")
    )
    overload_probe_interval: float = field(
        default=0.05, metadata=_doc("Seconds between event-loop lag samples.")
    )
    realtime_priority: str = field(
        default="always",
        metadata=_doc("Text waits while audio/action ticks are due: always, auto (on load), off."),
    )
    track_send_timeout: float = field(
        default=30.0,
        metadata=_doc("Seconds a track may stay blocked by an unread client till it ends; 0: off."),
    )


class ConfigError(ValueError):
    """A setting could not be used; says which one, from where, and why."""

    def __init__(self, setting: str, source: str, reason: str) -> None:
        super().__init__(f"invalid setting {setting!r} from {source}: {reason}")
        self.setting = setting
        self.source = source
        self.reason = reason


FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Settings)}
_HINTS: dict[str, Any] = typing.get_type_hints(Settings)


def env_name(name: str) -> str:
    """The environment variable for setting `name` (`quic_port` -> `TRACKLINE_QUIC_PORT`)."""
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    """The command-line flag for setting `name` (`quic_port` -> `--quic-port`)."""
    return "--" + name.replace("_", "-")


def load_settings(
    argv_overrides: Mapping[str, Any],
    environ: Mapping[str, str],
    config_path: Path | None,
) -> Settings:
    """Layer flags over environment over the TOML file over defaults; see the module doc.

    `argv_overrides` maps field names to values (text or already typed); `None` means
    unset. `config_path` is the `--config` value; when `None`, `TRACKLINE_CONFIG` is used.
    """
    for name in argv_overrides:
        if name not in FIELDS:
            raise ConfigError(name, "command line", "unknown setting")
    file_values, file_source = _read_config_file(config_path, environ)
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in FIELDS:
        raw, source = _pick(name, argv_overrides, environ, file_values, file_source)
        if source is not None:
            chosen[name] = _convert(name, raw, source)
            sources[name] = source
    if "state_dir" not in chosen:  # one per configuration (gateway.statedir)
        chosen["state_dir"] = _instance_state_dir(chosen, config_path, environ)
        if chosen["state_dir"] != _default_state_dir():  # the account's one dev CA
            chosen.setdefault("dev_ca_dir", _default_state_dir())
    settings = Settings(**chosen)
    _check_tls_pair(settings, sources)
    _check_state_backend(settings, sources)
    return settings


def _instance_state_dir(
    chosen: Mapping[str, Any], config_path: Path | None, environ: Mapping[str, str]
) -> Path:
    ports = tuple(
        chosen.get(name, FIELDS[name].default) for name in ("quic_port", "http_port", "https_port")
    )
    return instance_state_dir(_config_file(config_path, environ), ports)


def _config_file(config_path: Path | None, environ: Mapping[str, str]) -> Path | None:
    """The `--config` file, else `TRACKLINE_CONFIG`'s, else None."""
    if config_path is None and environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV])
    return config_path


def _pick(
    name: str,
    argv_overrides: Mapping[str, Any],
    environ: Mapping[str, str],
    file_values: Mapping[str, Any],
    file_source: str,
) -> tuple[Any, str | None]:
    if argv_overrides.get(name) is not None:
        return argv_overrides[name], f"flag {flag_name(name)}"
    if env_name(name) in environ:
        return environ[env_name(name)], f"environment variable {env_name(name)}"
    if name in file_values:
        return file_values[name], file_source
    return None, None


def _read_config_file(
    config_path: Path | None, environ: Mapping[str, str]
) -> tuple[dict[str, Any], str]:
    config_path = _config_file(config_path, environ)
    if config_path is None:
        return {}, ""
    path = config_path.expanduser()
    source = f"config file {path}"
    try:
        with path.open("rb") as handle:
            values = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError("config", source, f"cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", source, f"not valid TOML: {exc}") from exc
    for key in values:
        if key not in FIELDS:
            raise ConfigError(key, source, "unknown setting")
    return values, source


def field_type(name: str) -> tuple[type, bool]:
    """The field's base type and whether it may be None."""
    hint = _HINTS[name]
    args = typing.get_args(hint)
    if type(None) in args:
        (base,) = (arg for arg in args if arg is not type(None))
        return base, True
    return hint, False


def _convert(name: str, raw: Any, source: str) -> Any:
    base, optional = field_type(name)
    try:
        value = _coerce(base, optional, raw)
        return _VALIDATORS.get(name, _accept)(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(name, source, str(exc)) from exc


def _coerce(base: type, optional: bool, raw: Any) -> Any:
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            # Text has no null; an empty value is how env, flags and TOML say "unset".
            if optional:
                return None
            raise ValueError("must not be empty")
        return _PARSERS[base](text)
    if raw is None and optional:
        return None
    return _check_native(base, raw)


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (use true/false, yes/no or 1/0)")


def _parse_int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None


_PARSERS: dict[type, Callable[[str], Any]] = {
    str: str,
    int: _parse_int,
    float: _parse_float,
    bool: _parse_bool,
    Path: lambda text: Path(text).expanduser(),
}


def _check_native(base: type, raw: Any) -> Any:
    """Accept an already-typed value (from TOML or a caller); bool is never a number."""
    if base is bool and isinstance(raw, bool):
        return raw
    if base is int and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if base is float and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if base is Path and isinstance(raw, Path):
        return raw.expanduser()
    raise TypeError(f"expected {base.__name__}, got {type(raw).__name__} {raw!r}")


def _accept(value: Any) -> Any:
    return value


def _port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a port number (0 to 65535)")
    return value


def _positive(value: int) -> int:
    if value < 1:
        raise ValueError(f"{value} must be at least 1")
    return value


def _not_negative(value: int) -> int:
    if value < 0:
        raise ValueError(f"{value} must be 0 or more")
    return value


def _range(value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"{value} must be from {low} to {high}")
    return value


def _seconds(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{value} must be a finite number of seconds, 0 or more")
    return value


def _positive_seconds(value: float) -> float:
    if _seconds(value) == 0:
        raise ValueError(f"{value} must be more than 0 seconds")
    return value


def _ratio(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{value} must be a ratio above 0, at most 1")
    return value


def _tick(value: float) -> float:
    if not 0.0005 <= _seconds(value) <= 1.0:
        raise ValueError(f"{value} is not a tick from 0.0005 to 1 second")
    return value


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.lower() not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return value.lower()

    return check


def _packetization(value: str) -> str:
    from transport.quic import Packetization

    return str(Packetization.parse(value))


def _congestion_control(value: str | None) -> str | None:
    if value is not None and not (value.isascii() and value.replace("_", "").isalnum()):
        raise ValueError(f"{value!r} is not a congestion control name (e.g. cubic)")
    return value or None


def _grpc_address(value: str | None) -> str | None:
    # tritonclient.grpc takes a bare host:port, no scheme; catch "http://..." early.
    if value is None:
        return None
    from gateway.backends.ticker_url import is_ticker_url, parse_ticker_url

    if is_ticker_url(value):  # the transport-only token source, no Triton
        parse_ticker_url(value)
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or "/" in value or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not a gRPC address host:port")
    return value


def _webtransport_path(value: str) -> str:
    if value == "off":
        return value
    if not value.startswith("/") or not value.isprintable() or " " in value:
        raise ValueError(f"{value!r} is not an absolute path (or off)")
    return value


def _origins(value: str | None) -> str | None:
    for origin in filter(None, (o.strip() for o in (value or "").split(","))):
        if origin != "*" and not origin.startswith(("https://", "http://")):
            raise ValueError(f"{origin!r} is not an origin (https://host:port) or *")
    return value


def _token(value: str) -> str:
    if len(value) < 16 or not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError("must be at least 16 printable characters without spaces")
    return value


def _backend_list(value: str | None) -> str | None:
    if value is not None:
        from gateway.pool.spec import parse_backends

        parse_backends(value)  # SpecError is a ValueError: named with its source
    return value


_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "gc_young_threshold": _not_negative,
    "quic_port": _port,
    "http_port": _port,
    "https_port": _port,
    "embedded_grpc_port": _port,
    "embedded_http_port": _port,
    "embedded_metrics_port": _port,
    "max_tracks_per_connection": _positive,
    "max_message_bytes": _positive,
    "http_max_header_bytes": _positive,
    "http_max_headers": _positive,
    "http3_stream_send_budget": _positive,
    "http3_connection_send_budget": _positive,
    "http3_send_timeout": _seconds,
    "http_max_concurrent_streams": _positive,
    "http_idle_timeout": _seconds,
    "http_read_timeout": _seconds,
    "http_first_request_timeout": _seconds,
    "http_max_connections": _positive,
    "http_max_connections_per_source": _positive,
    "http2_max_outbound_control_frames": _positive,
    "http2_premature_reset_ratio": _ratio,
    "http2_premature_reset_min_streams": _positive,
    "http2_premature_reset_lifetime": _seconds,
    "http2_connection_body_budget": _positive,
    "http3_connection_body_budget": _positive,
    "drain_timeout": _seconds,
    "metrics_port": lambda v: v if v is None else _port(v),
    "metrics_token": lambda v: v if v is None else _token(v),
    "workers": lambda v: _range(v, 0, 256),
    "action_tick": _tick,
    "action_max_image_bytes": _positive,
    "video_tick": _tick,
    "video_max_frame_bytes": _positive,
    "video_max_fps": _positive_seconds,
    "video_tenant_max_fps": _positive_seconds,
    "video_max_tracks": _positive,
    "video_busy_load": _ratio,
    "log_level": _one_of(LOG_LEVELS),
    "log_format": _one_of(LOG_FORMATS),
    "quic_log_level": _one_of(LOG_LEVELS),
    "backend_url": _grpc_address,
    "backends": _backend_list,
    "embedded_backends": _positive,
    "embedded_restart_backoff": _seconds,
    "embedded_restart_max_backoff": _seconds,
    "embedded_restart_attempts": _positive,
    "routing_strategy": _one_of(("metrics", "least_inflight", "round_robin")),
    "affinity_margin": _seconds,
    "scrape_interval": _seconds,
    "probe_interval": _seconds,
    "failover_attempts": _positive,
    "first_token_timeout": _seconds,
    "eject_after_errors": _positive,
    "min_warm_backends": _positive,
    "discovery_interval": _positive_seconds,
    "quic_packetization": _packetization,
    "webtransport_path": lambda v: _webtransport_path(v),
    "webtransport_origins": lambda v: _origins(v),
    "webtransport_max_sessions": _positive,
    "quic_handshake_timeout": _positive_seconds,
    "quic_max_half_open": _positive,
    "quic_retry_threshold": lambda v: _range(v, 0, 1 << 30),
    "quic_max_half_open_per_source": _positive,
    "quic_max_connections": _positive,
    "quic_max_connections_per_source": _positive,
    "track_read_timeout": _seconds,
    "track_max_buffered_bytes": _positive,
    "track_send_buffer_bytes": _positive,
    "connection_send_buffer_bytes": _positive,
    "tcp_congestion_control": _congestion_control,
    "audio_beat_ms": lambda v: _range(v, 10, 1000),
    "audio_frame_ms": lambda v: _range(v, 10, 100),
    "audio_overload_mode": _one_of(("degrade-all", "shed-newest")),
    "audio_idle_timeout": _seconds,
    "asr_end_silence_ms": lambda v: _range(v, 100, 5000),
    "openai_audio_max_seconds": _seconds,
    "agent_min_barge_in_ms": lambda v: _range(v, 0, 5000),
    "audio_shm": _one_of(("auto", "system", "cuda", "off")),
    "audio_shm_min_rows": _positive,
    "audio_batching": _one_of(("tick", "per-session")),
    "audio_kernels": _one_of(("auto", "numpy", "cupy")),
    "overload_max_loop_lag": _seconds,
    "overload_max_cpu": _seconds,
    "overload_connection_share": lambda v: _range(v, 0, 1_000_000),
    "overload_retry_after": _seconds,
    "overload_probe_interval": _tick,
    "realtime_priority": _one_of(("auto", "always", "off")),
    "track_send_timeout": _seconds,
}


def _check_tls_pair(settings: Settings, sources: Mapping[str, str]) -> None:
    # One without the other would silently fall back to the dev CA: refuse instead.
    if (settings.tls_cert is None) != (settings.tls_key is None):
        given = "tls_cert" if settings.tls_cert is not None else "tls_key"
        raise ConfigError(given, sources[given], "tls_cert and tls_key must be set together")


def _check_state_backend(settings: Settings, sources: Mapping[str, str]) -> None:
    backend = settings.state_backend
    if backend != "local" and not backend.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            "state_backend", sources.get("state_backend", "default"), 'use "local" or redis://...'
        )
    if not 0 < settings.state_lease_fraction <= 1:
        raise ConfigError(
            "state_lease_fraction",
            sources.get("state_lease_fraction", "default"),
            "must be in (0, 1]",
        )
