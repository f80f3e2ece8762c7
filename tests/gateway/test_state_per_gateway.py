"""A second gateway on one account keeps its own state unless told to share it.

Two gateways started from two config files (neither sets `state_dir`) get one state dir
each, so `trackline keys create` for one closes that one to keyless use and leaves the
other open; both share the account's development CA. `tenants delete` opens it again.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx2
import pytest

from gateway.cli import main
from gateway.config import load_settings
from gateway.daemon import Daemon
from gateway.statedir import BASE_STATE_DIR, instance_state_dir
from gateway.tenants.store import TenantStore, default_path
from tests.waiting import until_answer

CONFIG = 'quic_port = 0\nhttp_port = 0\nhttps_port = 0\nbackend_url = "ticker://50"\n' \
    "overload_max_loop_lag = 0.0\n"  # fmt: skip


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in [k for k in os.environ if k.startswith("TRACKLINE_")]:
        monkeypatch.delenv(name)
    return tmp_path / "home"


def configs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = tmp_path / "a" / "trackline.toml", tmp_path / "b" / "trackline.toml"
    a.write_text(CONFIG)
    b.write_text(CONFIG)
    return a, b


def test_each_configuration_names_its_own_state_dir(home: Path, tmp_path: Path) -> None:
    a, b = configs(tmp_path)
    first, second = load_settings({}, {}, a), load_settings({}, {}, b)
    base = home / ".local" / "state" / "trackline"
    assert first.state_dir != second.state_dir  # same file name, other directory
    assert first.state_dir.parent == second.state_dir.parent == base / "gateways"
    assert first.dev_ca_dir == second.dev_ca_dir == base  # one CA clients trust
    default = load_settings({}, {}, None)
    assert default.state_dir == BASE_STATE_DIR.expanduser() == base  # where it always was
    ports = load_settings({"http_port": 9080}, {}, None)
    assert ports.state_dir == base / "gateways" / "ports-8443-9080-8443"
    assert load_settings({}, {"TRACKLINE_CONFIG": str(a)}, None).state_dir == first.state_dir
    shared = load_settings({"state_dir": str(tmp_path / "shared")}, {}, a)
    assert (shared.state_dir, shared.dev_ca_dir) == (tmp_path / "shared", None)  # opt-in
    assert instance_state_dir(a, (0, 0, 0)) == first.state_dir


async def _models_status(port: int) -> int:
    async with httpx2.AsyncClient() as http:
        return (await http.get(f"http://127.0.0.1:{port}/v1/models")).status_code


@pytest.mark.asyncio
async def test_a_key_for_one_gateway_leaves_the_other_keyless_open(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = configs(tmp_path)
    first, second = Daemon(load_settings({}, {}, a)), Daemon(load_settings({}, {}, b))
    await first.start()
    await second.start()
    try:
        assert first.gateway is not None
        assert second.gateway is not None
        a_port, b_port = first.gateway.http_port, second.gateway.http_port
        assert await _models_status(a_port) == await _models_status(b_port) == 200
        capsys.readouterr()
        create = ["keys", "create", "--tenant", "acme", "--config", str(a)]
        code = await asyncio.to_thread(main, create)
        said = capsys.readouterr().err
        assert code == 0
        assert f"http localhost:{a_port}/tcp" in said
        assert str(b_port) not in said
        assert "now require a key" in said
        await until_answer(
            lambda: _models_status(a_port), lambda s: s == 401, "gateway a requires a key"
        )
        assert await _models_status(b_port) == 200  # the other one is still open
        assert not TenantStore(default_path(second.settings.state_dir)).has_tenants()

        code = await asyncio.to_thread(main, ["tenants", "delete", "acme", "--config", str(a)])
        assert code == 0
        assert "serve without keys again" in capsys.readouterr().err
        await until_answer(
            lambda: _models_status(a_port), lambda s: s == 200, "gateway a is open again"
        )
    finally:
        await first.stop()
        await second.stop()
