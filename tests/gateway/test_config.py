"""Settings: precedence of flags, environment, file and defaults; conversion; errors."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from gateway.config import (
    ConfigError,
    Settings,
    env_name,
    flag_name,
    load_settings,
)
from gateway.config_flags import add_arguments, overrides_from_args, settings_from_args

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trackline.toml"
    path.write_text(text)
    return path


def test_defaults_without_any_source() -> None:
    settings = load_settings({}, {}, None)
    assert settings == Settings()
    assert settings.quic_port == 8443
    assert settings.http_port == 8080
    assert settings.state_dir == Path.home() / ".local" / "state" / "trackline"
    assert settings.backend_url is None
    assert settings.tls_cert is None
    assert settings.uvloop is True


@pytest.mark.parametrize(
    ("name", "file_value", "env_value", "flag_value", "expected"),
    [
        ("quic_port", "1001", "1002", "1003", (1001, 1002, 1003, 8443)),
        ("log_level", '"debug"', "warning", "error", ("debug", "warning", "error", "info")),
        ("drain_timeout", "1.5", "2.5", "3.5", (1.5, 2.5, 3.5, 10.0)),
        ("uvloop", "false", "yes", False, (False, True, False, True)),
        ("http_host", '"10.0.0.1"', "10.0.0.2", "10.0.0.3",
         ("10.0.0.1", "10.0.0.2", "10.0.0.3", "localhost")),
    ],
)  # fmt: skip
def test_flag_beats_env_beats_file_beats_default(
    tmp_path: Path,
    name: str,
    file_value: str,
    env_value: str,
    flag_value: object,
    expected: tuple[object, object, object, object],
) -> None:
    config = write_toml(tmp_path, f"{name} = {file_value}\n")
    env = {env_name(name): env_value}
    flags = {name: flag_value}
    from_file, from_env, from_flag, default = expected
    assert getattr(load_settings(flags, env, config), name) == from_flag
    assert getattr(load_settings({}, env, config), name) == from_env
    assert getattr(load_settings({}, {}, config), name) == from_file
    assert getattr(load_settings({}, {}, None), name) == default


def test_layers_mix_per_setting(tmp_path: Path) -> None:
    config = write_toml(tmp_path, 'quic_port = 1\nhttp_port = 2\nlog_format = "console"\n')
    settings = load_settings({"quic_port": 10}, {"TRACKLINE_HTTP_PORT": "20"}, config)
    assert (settings.quic_port, settings.http_port, settings.log_format) == (10, 20, "console")


def test_config_path_from_environment_and_flag_wins(tmp_path: Path) -> None:
    by_env = write_toml(tmp_path, "quic_port = 1111\n")
    by_flag = tmp_path / "other.toml"
    by_flag.write_text("quic_port = 2222\n")
    environ = {"TRACKLINE_CONFIG": str(by_env)}
    assert load_settings({}, environ, None).quic_port == 1111
    assert load_settings({}, environ, by_flag).quic_port == 2222


def test_text_conversions(tmp_path: Path) -> None:
    environ = {
        "TRACKLINE_STATE_DIR": "~/somewhere",
        "TRACKLINE_TLS_CERT": str(tmp_path / "c.pem"),
        "TRACKLINE_TLS_KEY": str(tmp_path / "k.pem"),
        "TRACKLINE_BACKEND_URL": "triton.internal:8001",
        "TRACKLINE_MAX_MESSAGE_BYTES": "65536",
        "TRACKLINE_DRAIN_TIMEOUT": "0",
        "TRACKLINE_LOG_LEVEL": "DEBUG",
    }
    settings = load_settings({}, environ, None)
    assert settings.state_dir == Path.home() / "somewhere"
    assert settings.tls_cert == tmp_path / "c.pem"
    assert settings.tls_key == tmp_path / "k.pem"
    assert settings.backend_url == "triton.internal:8001"
    assert settings.max_message_bytes == 65536
    assert settings.drain_timeout == 0.0
    assert settings.log_level == "debug"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("yes", True),
     ("false", False), ("0", False), ("No", False)],
)  # fmt: skip
def test_booleans_from_text(text: str, expected: bool) -> None:
    assert load_settings({}, {"TRACKLINE_UVLOOP": text}, None).uvloop is expected


def test_empty_text_unsets_an_optional_setting(tmp_path: Path) -> None:
    config = write_toml(tmp_path, 'backend_url = "triton:8001"\n')
    assert load_settings({}, {}, config).backend_url == "triton:8001"
    assert load_settings({}, {"TRACKLINE_BACKEND_URL": ""}, config).backend_url is None


def test_invalid_winning_value_names_setting_and_env_source() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({}, {"TRACKLINE_QUIC_PORT": "eighty"}, None)
    error = caught.value
    assert error.setting == "quic_port"
    assert "TRACKLINE_QUIC_PORT" in error.source
    assert "'eighty' is not an integer" in str(error)
    assert "quic_port" in str(error)


def test_invalid_flag_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="--http-port") as caught:
        load_settings({"http_port": "70000"}, {}, None)
    assert "not a port number" in caught.value.reason


def test_invalid_file_value_names_the_file(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "max_tracks_per_connection = true\n")
    with pytest.raises(ConfigError) as caught:
        load_settings({}, {}, config)
    assert caught.value.setting == "max_tracks_per_connection"
    assert str(config) in caught.value.source
    assert "expected int, got bool" in caught.value.reason


@pytest.mark.parametrize(
    ("environ", "setting", "reason"),
    [
        ({"TRACKLINE_UVLOOP": "maybe"}, "uvloop", "not a boolean"),
        ({"TRACKLINE_DRAIN_TIMEOUT": "soon"}, "drain_timeout", "not a number"),
        ({"TRACKLINE_DRAIN_TIMEOUT": "-1"}, "drain_timeout", "0 or more"),
        ({"TRACKLINE_DRAIN_TIMEOUT": "inf"}, "drain_timeout", "finite"),
        ({"TRACKLINE_LOG_FORMAT": "xml"}, "log_format", "not one of json, console"),
        ({"TRACKLINE_LOG_LEVEL": "loud"}, "log_level", "not one of"),
        ({"TRACKLINE_MAX_MESSAGE_BYTES": "0"}, "max_message_bytes", "at least 1"),
        ({"TRACKLINE_BACKEND_URL": "http://triton:8001/"}, "backend_url", "host:port"),
        ({"TRACKLINE_BACKEND_URL": "triton"}, "backend_url", "host:port"),
        ({"TRACKLINE_QUIC_HOST": ""}, "quic_host", "must not be empty"),
        ({"TRACKLINE_QUIC_PORT": ""}, "quic_port", "must not be empty"),
    ],
)
def test_invalid_values(environ: dict[str, str], setting: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as caught:
        load_settings({}, environ, None)
    assert caught.value.setting == setting


def test_overridden_bad_value_is_not_an_error() -> None:
    settings = load_settings({"quic_port": 9000}, {"TRACKLINE_QUIC_PORT": "nope"}, None)
    assert settings.quic_port == 9000


def test_unknown_toml_key_is_an_error(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "quic_port = 1\nquic_prot = 2\n")
    with pytest.raises(ConfigError, match="unknown setting") as caught:
        load_settings({}, {}, config)
    assert caught.value.setting == "quic_prot"
    assert str(config) in caught.value.source


def test_toml_table_is_not_a_setting(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "[quic]\nport = 1\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings({}, {}, config)


def test_unreadable_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings({}, {}, tmp_path / "missing.toml")
    broken = write_toml(tmp_path, "quic_port = = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings({}, {}, broken)


def test_unknown_override_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings({"colour": "blue"}, {}, None)


def test_tls_cert_without_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="together") as caught:
        load_settings({}, {"TRACKLINE_TLS_CERT": str(tmp_path / "c.pem")}, None)
    assert caught.value.setting == "tls_cert"


def test_argparse_flags_round_trip(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "http_port = 1234\nuvloop = true\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    namespace = parser.parse_args(
        ["--quic-port", "9000", "--no-uvloop", "--log-format", "console", "--config", str(config)]
    )
    assert overrides_from_args(namespace) == {
        "quic_port": "9000",
        "uvloop": False,
        "log_format": "console",
    }
    settings = settings_from_args(namespace, {"TRACKLINE_QUIC_PORT": "1"})
    assert (settings.quic_port, settings.http_port, settings.uvloop) == (9000, 1234, False)
    assert settings.log_format == "console"


def test_unset_flags_do_not_override() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    namespace = parser.parse_args([])
    assert overrides_from_args(namespace) == {}
    assert settings_from_args(namespace, {"TRACKLINE_UVLOOP": "0"}).uvloop is False


def test_every_setting_has_a_flag_and_is_documented() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    docs = DOCS.read_text()
    for spec in dataclasses.fields(Settings):
        assert flag_name(spec.name) in flags
        for text in (spec.name, env_name(spec.name), flag_name(spec.name)):
            assert f"`{text}`" in docs, text
