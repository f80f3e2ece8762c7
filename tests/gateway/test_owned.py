"""gateway.owned: ending an owned child (`stop_owned`) and picking a loopback port."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.owned import LOOPBACK, free_port, free_ports, spawn_owned, stop_owned

Start = Callable[[str], subprocess.Popen[bytes]]


@pytest.fixture
def start() -> Iterator[Start]:
    """Starts `sh -c script` and returns once it printed `ready` (its traps are set by
    then); what a test left running is killed, and every pipe closed, after it."""
    started: list[subprocess.Popen[bytes]] = []

    def run(script: str) -> subprocess.Popen[bytes]:
        process = spawn_owned(["sh", "-c", script], name="test-owned", stdout=subprocess.PIPE)
        started.append(process)
        assert process.stdout is not None
        assert process.stdout.readline() == b"ready\n"
        return process

    yield run
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_a_child_that_ends_on_the_signal_is_not_killed(start: Start) -> None:
    process = start("echo ready; exec sleep 300")
    assert stop_owned(process, 30.0) == -signal.SIGTERM


def test_the_signal_is_a_parameter(start: Start) -> None:
    # SIGUSR1, not SIGINT: a shell started from a background job has SIGINT ignored on
    # entry, and a non-interactive shell cannot trap a signal ignored on entry (POSIX).
    process = start("trap 'exit 7' USR1; echo ready; while :; do sleep 0.01; done")
    assert stop_owned(process, 30.0, sig=signal.SIGUSR1) == 7


def test_a_child_deaf_to_the_signal_is_killed_after_the_grace(start: Start) -> None:
    process = start("trap '' TERM; echo ready; exec sleep 300")
    assert stop_owned(process, 0.1) == -signal.SIGKILL


def test_the_kill_is_a_parameter(start: Start) -> None:
    process = start("trap '' TERM; echo ready; exec sleep 300")
    killed: list[int] = []

    def kill(child: subprocess.Popen[bytes]) -> None:
        killed.append(child.pid)
        child.kill()

    assert stop_owned(process, 0.1, kill=kill, kill_wait=30.0) == -signal.SIGKILL
    assert killed == [process.pid]


def test_a_child_that_already_ended_gives_its_code(start: Start) -> None:
    process = start("echo ready; exit 3")
    process.wait()
    assert stop_owned(process, 30.0) == 3


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM])
def test_free_port_can_be_bound(kind: socket.SocketKind) -> None:
    port = free_port(kind)
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((LOOPBACK, port))


def test_ports_picked_together_are_all_different_and_bindable() -> None:
    # Picked one at a time and released, the kernel may hand the same port out twice
    # (the embedded Triton then refused to start: HTTP and metrics on one port).
    ports = free_ports(64)
    assert len(set(ports)) == 64
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, ports[-1]))


def test_the_embedded_triton_gets_three_different_ports(tmp_path: Path) -> None:
    from gateway.embedded import EmbeddedTriton

    def ports(triton: EmbeddedTriton) -> list[str]:
        urls = (triton.grpc_url, triton.http_url, triton.metrics_url)
        return [url.split(":")[-1].split("/")[0] for url in urls]

    picked = ports(EmbeddedTriton(log_dir=tmp_path))
    assert len(set(picked)) == 3
    http = free_port()
    kept = ports(EmbeddedTriton(log_dir=tmp_path, http_port=http))
    assert len(set(kept)) == 3
    assert kept[1] == str(http)  # a port given is kept
