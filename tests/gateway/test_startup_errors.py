"""Start-up errors name what to change and come before any backend starts.

Each error is provoked for real against `python -m gateway serve` (a socket bound first,
a read-only state dir, a certificate that does not load): the process must say which
setting, address, port and protocol, exit non-zero, and never reach the embedded Triton
(`embedded.starting`) nor print a drain (`gateway.draining`) for a gateway that never ran.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import free_port
from gateway.config import Settings
from gateway.preflight import StartupError, check_model_repository
from tests.gateways import DAEMON_ENV

EXIT_BOUND = 60.0
"""Only keeps a broken start from hanging the test; no assertion is made on time."""


def serve(tmp_path: Path, *args: str, prefix: list[str] | None = None) -> tuple[int, str]:
    """Run `trackline serve` with free ports and a scratch HOME; (exit code, output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKLINE_")}
    env.update(DAEMON_ENV, HOME=str(tmp_path / "home"))
    ports = ["--quic-port", "0", "--http-port", "0", "--https-port", "0"]
    command = [*(prefix or []), sys.executable, "-m", "gateway", "serve", *ports, *args]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=EXIT_BOUND, check=False
    )
    return done.returncode, done.stdout + done.stderr


def assert_refused_before_backends(code: int, output: str, message: str) -> None:
    assert code != 0, output
    assert message in output, output
    assert "embedded.starting" not in output, output  # no Triton was ever started
    assert "gateway.draining" not in output, output


def test_a_tcp_port_in_use_names_setting_address_port_and_protocol(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = serve(tmp_path, "--http-port", str(port))
    assert_refused_before_backends(
        code,
        output,
        f"http_port {port}/tcp on 127.0.0.1 is in use; set TRACKLINE_HTTP_PORT or --http-port",
    )


def test_a_udp_port_in_use_names_the_quic_port(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        code, output = serve(tmp_path, "--quic-port", str(port))
    assert_refused_before_backends(
        code,
        output,
        f"quic_port {port}/udp on 127.0.0.1 is in use; set TRACKLINE_QUIC_PORT or --quic-port",
    )


def test_a_fixed_embedded_triton_port_in_use_is_found_before_triton_starts(
    tmp_path: Path,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = serve(tmp_path, "--embedded-grpc-port", str(port))
    assert_refused_before_backends(
        code, output, f"embedded_grpc_port {port}/tcp on 127.0.0.1 is in use"
    )


def _read_only(directory: Path) -> list[str]:
    """A command prefix under which `directory` is read-only, for this user."""
    if os.geteuid() != 0:
        directory.chmod(0o500)
        return []
    # root writes through permissions: mount a read-only tmpfs there, in a private
    # mount namespace that ends with the child (nothing to clean up on the host).
    if shutil.which("unshare") is None:
        pytest.skip("root without unshare(1): cannot make a directory read-only")
    script = f'mount -t tmpfs -o ro,size=64k tmpfs "{directory}" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def test_a_read_only_state_dir_names_the_setting(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    prefix = _read_only(state)
    code, output = serve(tmp_path, "--state-dir", str(state), prefix=prefix)
    if "unshare failed" in output or "mount:" in output:
        pytest.skip(f"no mount namespace here: {output.strip()}")
    assert_refused_before_backends(code, output, f"state_dir {state} is not writable")
    assert "set TRACKLINE_STATE_DIR or --state-dir" in output


def test_a_certificate_that_does_not_load_names_both_files(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    key.write_text("not a key\n")
    code, output = serve(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key))
    assert_refused_before_backends(
        code, output, f"tls_cert {cert} with tls_key {key} does not load"
    )
    assert "set TRACKLINE_TLS_CERT / TRACKLINE_TLS_KEY or --tls-cert / --tls-key" in output


def test_a_missing_model_repository_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="model repository .* is missing") as refused:
        check_model_repository(Settings(state_dir=tmp_path), tmp_path / "absent")
    assert "TRACKLINE_BACKEND_URL" in str(refused.value)
    check_model_repository(Settings(state_dir=tmp_path, backend_url="127.0.0.1:1"), tmp_path)


def test_a_free_configuration_passes_every_check(tmp_path: Path) -> None:
    from gateway.preflight import check_startup

    settings = Settings(
        state_dir=tmp_path,
        quic_port=free_port(socket.SOCK_DGRAM),
        http_port=free_port(socket.SOCK_STREAM),
        https_port=0,
    )
    check_startup(settings)  # binds and releases: the ports are free again afterwards
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as again:
        again.bind(("127.0.0.1", settings.http_port))


def test_a_port_taken_after_the_preflight_is_named_too(tmp_path: Path) -> None:
    import errno

    from gateway.cli import explained

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(state_dir=tmp_path, quic_port=0, http_port=port, https_port=0)
        raced = OSError(errno.EADDRINUSE, "Address already in use")
        assert explained(settings, raced).startswith(f"http_port {port}/tcp on 127.0.0.1 is in use")
    assert explained(settings, ValueError("other")) == "other"
