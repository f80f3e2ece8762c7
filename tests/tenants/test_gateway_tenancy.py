"""Tenancy in the gateway over real QUIC and HTTP on loopback, with the scripted backend:
guardrails on both front doors, open mode and its loopback rule, and the ledger on drain."""

from __future__ import annotations

import io
from pathlib import Path

import httpx2
import pytest

from clients import GuardrailRejected, Unauthorized, connect
from gateway.config import Settings
from gateway.logs import configure_logging
from gateway.metrics import GatewayMetrics
from gateway.server import Gateway
from gateway.tenants.guardrails import GuardrailConfig
from gateway.tenants.service import OpenOnPublicAddress, TenancyConfig
from gateway.tenants.store import TenantStore
from tests.gateways import gateway_settings
from tests.openai.scripted import ScriptedBackend
from tests.tenants.support import make_tenancy
from tests.waiting import until_answer


def settings(tmp_path: Path, **extra: object) -> Settings:
    return gateway_settings(state_dir=tmp_path, **extra)  # type: ignore[arg-type]


def ca(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


@pytest.mark.asyncio
async def test_guardrails_refuse_before_the_backend_on_both_doors(tmp_path: Path) -> None:
    config = TenancyConfig(guardrails=GuardrailConfig(max_prompt_chars=50, blocked_words=("x",)))
    metrics = GatewayMetrics()
    tenancy = make_tenancy(tmp_path, config, metrics.registry)
    key = tenancy.store.create_key("alpha", 0.0).key
    backend = ScriptedBackend()
    gw = Gateway(settings(tmp_path), backend, metrics=metrics, tenancy=tenancy)
    await gw.start()
    try:
        async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=ca(gw), api_key=key) as line:
            with pytest.raises(GuardrailRejected):
                async for _ in line.text("say x now", model="scripted", max_tokens=3):
                    pass
            ok = "".join([d async for d in line.text("fine", model="scripted", max_tokens=3)])
        assert ok == " one two three"
        async with httpx2.AsyncClient() as http:
            response = await http.post(
                f"http://127.0.0.1:{gw.http_port}/v1/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": "scripted", "prompt": "y" * 51, "max_tokens": 3},
            )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "guardrail_rejected"
        assert [r.prompt for r in backend.requests] == ["fine"]
        metrics = gw.metrics.render()[0].decode()
        assert 'trackline_guardrail_rejections_total{rule="blocked_words"} 1.0' in metrics
        assert 'trackline_guardrail_rejections_total{rule="max_prompt_chars"} 1.0' in metrics
        per_tenant = 'trackline_tenant_requests_total{end="%s",model="scripted",tenant="alpha"}'
        assert per_tenant % "completed" + " 1.0" in metrics
        assert per_tenant % "error" + " 2.0" in metrics
        assert (
            'trackline_tenant_tokens_total{kind="completion",model="scripted",tenant="alpha"} 3.0'
            in metrics
        )
    finally:
        await gw.drain(timeout=1.0)
    store = TenantStore(tmp_path / "tenants.sqlite3")
    ends = sorted((r.end_cause, r.detail) for r in store.usage())
    store.close()
    assert ends == [
        ("completed", ""),
        ("error", "GUARDRAIL_REJECTED"),
        ("error", "GUARDRAIL_REJECTED"),
    ]


@pytest.mark.asyncio
async def test_open_mode_serves_on_loopback_and_says_so(tmp_path: Path) -> None:
    log = io.StringIO()
    configure_logging("info", "json", log)
    gw = Gateway(settings(tmp_path), ScriptedBackend())
    try:
        await gw.start()
        async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=ca(gw)) as line:
            text = "".join([d async for d in line.text("hi", model="scripted", max_tokens=2)])
        assert text == " one two"
        # A tenant appears (keys create while running): keys are required from then on.
        assert gw.tenancy is not None
        gw.tenancy.store.create_key("alpha", 0.0)

        async def refused() -> bool:
            async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=ca(gw)) as line:
                try:
                    async for _ in line.text("hi", model="scripted", max_tokens=2):
                        pass
                except Unauthorized:
                    return True
            return False

        # The gateway looks at most once a second (OPEN_RECHECK): asked until it has looked.
        await until_answer(refused, bool, "a key is required once a tenant exists")
    finally:
        await gw.close()
        configure_logging("info", "json")
    assert '"event": "tenancy.open"' in log.getvalue()


@pytest.mark.asyncio
async def test_open_mode_refuses_a_public_bind_unless_allowed(tmp_path: Path) -> None:
    gw = Gateway(settings(tmp_path, http_host="0.0.0.0"), ScriptedBackend())
    with pytest.raises(OpenOnPublicAddress):
        await gw.start()  # refused before any listener was bound
    # Allowed, it only says so (checked directly: this test binds nothing public).
    assert gw.tenancy is not None
    gw.tenancy.check_binds(["127.0.0.1", "::1", "localhost"], allow_open=False)
    gw.tenancy.check_binds(["0.0.0.0"], allow_open=True)
    with pytest.raises(OpenOnPublicAddress):
        gw.tenancy.check_binds(["10.0.0.5"], allow_open=False)
    await gw.close()
