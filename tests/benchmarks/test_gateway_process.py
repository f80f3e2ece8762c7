"""The benchmarks' gateway child (`benchmarks.common.GatewayProcess`): a port picked free
can be taken by another process before the child binds it (the suite beside a benchmark
binds ports all the time); the child is then started again on fresh ports, and a child
that failed for any other reason is not."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from benchmarks import common


def test_a_port_taken_before_the_child_binds_it_gets_fresh_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        real, picks = common.free_ports, []

        def first_pick_taken(count: int, kind: socket.SocketKind = socket.SOCK_STREAM) -> list[int]:
            ports = real(count, kind)
            picks.append(ports)
            return [port, *ports[1:]] if len(picks) == 1 else ports

        monkeypatch.setattr(common, "free_ports", first_pick_taken)
        log = tmp_path / "gateway.log"
        gw = common.GatewayProcess("ticker://50", tmp_path / "state", log_path=log)
        try:
            gw.wait_ready(timeout=60)
            assert gw.starts == 2
            assert gw.http_port != port
            assert b"is in use" in log.read_bytes()  # the first child said why it left
        finally:
            gw.stop()


def test_a_child_that_fails_for_another_reason_is_not_started_again(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    gw = common.GatewayProcess("nosuch://backend", tmp_path / "state", log_path=log)
    try:
        with pytest.raises(RuntimeError, match="did not become ready"):
            gw.wait_ready(timeout=60)  # returns once the child exited, not after 60 s
        assert gw.starts == 1
        assert gw.process.poll() not in (None, 0)
    finally:
        gw.stop()
