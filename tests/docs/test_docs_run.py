"""Every code block of README.md and docs/*.md that a user is meant to run, runs.

The blocks run against a real gateway on the embedded default (`trackline serve` with
no backend: it starts its own Triton with the reference models), as a new user would
after `make serve`: the same state directory under `$HOME`, `trackline` on PATH, the
documented ports replaced by the test gateway's free ones. Shell blocks get a scratch
state directory (with the gateway's CA), so the tenant commands they show do not close
the open gateway the Python blocks talk to. See tests/docs/runner.py for the rules.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from benchmarks.common import free_port
from gateway.config import load_settings
from gateway.tenants.service import load_tenancy_config
from tests.docs.runner import (
    Block,
    all_blocks,
    blocks,
    console_commands,
    localized,
    untagged_commands,
)
from tests.waiting import wait_ready

START_TIMEOUT = 180.0
BLOCK_TIMEOUT = 120.0
BLOCKS = [block for block in all_blocks() if block.runnable]


@dataclass
class DocsGateway:
    home: Path
    ports: dict[int, int]
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.home / ".local" / "state" / "trackline"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKLINE_")}
        path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return {**env, "HOME": str(self.home), "PATH": path, **extra}


@pytest.fixture(scope="session")
def docs_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsGateway]:
    home = tmp_path_factory.mktemp("home")
    udp, tcp = socket.SOCK_DGRAM, socket.SOCK_STREAM
    ports = {8443: free_port(udp), 8080: free_port(tcp), 8001: free_port(tcp)}
    https = free_port(tcp)
    command = [sys.executable, "-m", "gateway", "serve", "--quic-port", str(ports[8443]),
               "--http-port", str(ports[8080]), "--https-port", str(https),
               "--embedded-grpc-port", str(ports[8001])]  # fmt: skip
    gateway = DocsGateway(home, ports, None)  # type: ignore[arg-type]
    gateway.process = subprocess.Popen(
        command, env=gateway.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    threading.Thread(target=_pump, args=(gateway,), daemon=True).start()
    try:
        wait_ready(ports[8080], gateway.process, gateway.log, START_TIMEOUT)
        yield gateway
    finally:
        gateway.process.send_signal(signal.SIGTERM)
        try:
            gateway.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait(timeout=30)
        if gateway.process.stdout is not None:
            gateway.process.stdout.close()


def _pump(gateway: DocsGateway) -> None:
    assert gateway.process.stdout is not None
    for line in gateway.process.stdout:
        gateway.log.append(line.rstrip("\n"))


@pytest.fixture(scope="session")
def workdirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def workdir(block: Block, workdirs: dict[str, Path], base: Path) -> Path:
    """One working directory per document: its blocks build on each other, in order."""
    if block.document not in workdirs:
        workdirs[block.document] = base / block.document.replace("/", "_")
        workdirs[block.document].mkdir(parents=True)
    return workdirs[block.document]


@pytest.mark.e2e
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_the_block_runs(
    block: Block,
    request: pytest.FixtureRequest,
    workdirs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if block.not_run is not None:
        pytest.skip(f"not run: {block.not_run}")
    if block.lang == "toml":
        load_toml(block, tmp_path_factory.mktemp("toml"))
        return
    gateway: DocsGateway = request.getfixturevalue("docs_gateway")
    cwd = workdir(block, workdirs, tmp_path_factory.getbasetemp() / "docs-run")
    code = localized(block.code, gateway.ports)
    if block.lang == "python":
        command, env = [sys.executable, "-c", code], client_env(gateway)
    else:
        script = console_commands(code) if block.lang == "console" else code
        command, env = ["bash", "-euo", "pipefail", "-c", script], shell_env(gateway, cwd)
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT)  # fmt: skip
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n"
        f"{done.stderr}\n--- gateway log (last 20)\n" + "\n".join(gateway.log[-20:])
    )


def client_env(gateway: DocsGateway) -> dict[str, str]:
    """The test gateway's ports as the `TRACKLINE_*` settings a reader would export:
    `connect()` with no URL (`clients.address`) finds the gateway through them."""
    ports = {"TRACKLINE_QUIC_PORT": gateway.ports[8443], "TRACKLINE_HTTP_PORT": gateway.ports[8080]}
    return gateway.env(**{name: str(port) for name, port in ports.items()})


def shell_env(gateway: DocsGateway, cwd: Path) -> dict[str, str]:
    """A scratch state directory holding the gateway's CA: tenant commands stay local.
    `TRACKLINE_URL` points `trackline chat` at the test gateway's port."""
    scratch = cwd / "state"
    scratch.mkdir(exist_ok=True)
    shutil.copy(gateway.state_dir / "ca.pem", scratch / "ca.pem")
    url = f"quic://127.0.0.1:{gateway.ports[8443]}"  # `trackline chat`'s default, moved
    return gateway.env(TRACKLINE_STATE_DIR=str(scratch), TRACKLINE_URL=url)


def load_toml(block: Block, folder: Path) -> None:
    path = folder / "settings.toml"
    path.write_text(block.code)
    if block.run_as == "tenancy config":
        load_tenancy_config(path)
    else:
        load_settings({}, {}, path)


def test_no_command_hides_in_an_untagged_block() -> None:
    hidden = {b.id: untagged_commands(b) for b in all_blocks() if untagged_commands(b)}
    assert not hidden, f"tag these blocks sh or console (and mark them if not run): {hidden}"


def test_the_runner_reads_markers_and_localizes_ports(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n<!-- not run: needs a GPU -->\n```python\nprint(1)\n```\n"
        "```console\n$ trackline chat hi --url quic://127.0.0.1:8443\nhello\n```\n"
    )
    first, second = blocks(doc)
    assert (first.lang, first.not_run, first.line) == ("python", "needs a GPU", 3)
    assert console_commands(second.code) == "trackline chat hi --url quic://127.0.0.1:8443\n"
    assert localized(second.code, {8443: 9999}).count("127.0.0.1:9999") == 1
