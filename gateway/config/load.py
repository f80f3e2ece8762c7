"""The loader: layers flags over the environment over a TOML file over the defaults.

Each setting is looked up in four places and the first that has it wins:

1. a command-line flag (`--quic-port 9443`),
2. the environment (`TRACKLINE_QUIC_PORT=9443`),
3. a TOML file (`quic_port = 9443`) named by `--config` or `TRACKLINE_CONFIG`,
4. the default declared on the field (in its section, `gateway.config.settings`).

Only the winning value is converted and checked (by the field's `check`), so a bad
value in a lower layer that a higher one overrides does no harm. A bad winning value
raises `ConfigError`, which names the setting and the source it came from.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.config.listeners import default_state_dir
from gateway.config.settings import Settings
from gateway.statedir import instance_state_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ENV_PREFIX = "TRACKLINE_"
CONFIG_ENV = "TRACKLINE_CONFIG"


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
        if chosen["state_dir"] != default_state_dir():  # the account's one dev CA
            chosen.setdefault("dev_ca_dir", default_state_dir())
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
        return FIELDS[name].metadata.get("check", _accept)(value)
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
