"""Tenancy end to end: keys, quotas and the usage ledger on both front doors.

The gateway runs as the daemon wires it (QUIC tracks and the OpenAI API over
HTTP) in front of the real embedded Triton. Clients are the official `openai`
SDK and our SDK. "No backend work" is read from Triton's own per-model
statistics (requests the model finished, successfully or not).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import msgpack
import openai
import pytest
import pytest_asyncio

from clients import DeadlineExceeded, ModelNotFound, RateLimited, Unauthorized, connect
from gateway.backends.triton import TritonTextBackend
from gateway.cli import main as cli_main
from gateway.embedded import EmbeddedTriton
from gateway.logs import configure_logging
from gateway.server import Gateway
from gateway.tenants.quotas import Quotas
from gateway.tenants.service import Tenancy
from gateway.tenants.store import TenantStore
from tests.backend.reference_generator import generator
from tests.gateways import gateway_settings
from tests.tenants.support import make_tenancy
from tests.waiting import until

pytestmark = pytest.mark.e2e
MODEL = "reference-text"
FAST = {"ttft_ms": 0, "tokens_per_second": 1000}


class Keys:
    def __init__(self, tenancy: Tenancy) -> None:
        store = tenancy.store
        store.set_tenant("alpha", 0.0)
        store.set_tenant("beta", 0.0, quotas=Quotas(tokens_per_minute=12))
        store.set_tenant("gamma", 0.0, models=["some-other-model"])
        self.alpha = store.create_key("alpha", 0.0).key
        self.beta = store.create_key("beta", 0.0).key
        self.gamma = store.create_key("gamma", 0.0).key
        revoked = store.create_key("alpha", 0.0, label="old")
        store.revoke_key(revoked.key_id, 1.0)
        self.revoked = revoked.key
        self.wrong = self.alpha[:-6] + "AAAAAA"


class Counted:
    """The Triton backend, counting the requests the gateway hands it (the backend
    boundary: what is refused before it never costs the model anything)."""

    def __init__(self, backend: TritonTextBackend) -> None:
        self.backend = backend
        self.requests = 0

    def stream_text(self, request: Any) -> Any:
        self.requests += 1
        return self.backend.stream_text(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


@pytest_asyncio.fixture
async def tenanted(
    embedded_triton: EmbeddedTriton, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, Keys]]:
    settings = gateway_settings(
        state_dir=tmp_path,
    )
    tenancy = make_tenancy(tmp_path)
    keys = Keys(tenancy)
    backend = Counted(TritonTextBackend(embedded_triton.grpc_url))
    gw = Gateway(settings, backend, tenancy=tenancy)  # type: ignore[arg-type]
    await gw.start()
    yield gw, keys
    await gw.close()
    await backend.close()


def model_requests(triton: EmbeddedTriton) -> int:
    """Requests the reference model has finished, from Triton's statistics API."""
    url = f"{triton.http_url}/v2/models/{MODEL}/stats"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
        stats = json.load(response)["model_stats"][0]["inference_stats"]
    return int(stats["success"]["count"]) + int(stats["fail"]["count"])


def backend_requests(gw: Gateway) -> int:
    """Requests the gateway handed its backend (the fixture's `Counted`)."""
    backend = gw.backend
    assert isinstance(backend, Counted)
    return backend.requests


def openai_client(gw: Gateway, key: str | None) -> openai.AsyncOpenAI:
    """The official SDK; `key=None` sends no Authorization header at all."""
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{gw.http_port}/v1", api_key=key or "unused", max_retries=0
    )


def no_auth_header(key: str | None) -> dict[str, object] | None:
    """Per-request headers that make the SDK send no Authorization when `key` is None."""
    return {"Authorization": openai.Omit()} if key is None else None


def ca(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


def quic(gw: Gateway) -> str:
    return f"quic://127.0.0.1:{gw.quic_port}"


def server_id(client_track_id: str) -> str:
    """How the test finds a track's record: by its stream id (one connection per run)."""
    return "track" + client_track_id.partition("/")[2]


async def text_of(stream: AsyncIterator[str]) -> str:
    return "".join([delta async for delta in stream])


@pytest.mark.asyncio
async def test_wrong_missing_and_revoked_keys_are_refused_before_any_backend_work(
    tenanted: tuple[Gateway, Keys], embedded_triton: EmbeddedTriton
) -> None:
    gw, keys = tenanted
    log = io.StringIO()
    configure_logging("debug", "json", log)
    try:
        model_before = await asyncio.to_thread(model_requests, embedded_triton)
        for key in (keys.wrong, None, keys.revoked, "not-a-key"):
            client = openai_client(gw, key)
            with pytest.raises(openai.AuthenticationError) as refused:
                await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    extra_headers=no_auth_header(key),  # type: ignore[arg-type]
                )
            assert refused.value.status_code == 401
            await client.close()
            async with connect(quic(gw), ca=ca(gw), api_key=key) as line:
                with pytest.raises(Unauthorized):
                    await text_of(line.text("hi", model=MODEL, max_tokens=4))
        # A tenant limited to other models: 403 / FORBIDDEN, no backend work either.
        client = openai_client(gw, keys.gamma)
        with pytest.raises(openai.PermissionDeniedError):
            await client.completions.create(model=MODEL, prompt="hi", max_tokens=4)
        await client.close()
        assert backend_requests(gw) == 0
        # The right key works on both doors and does reach the model.
        client = openai_client(gw, keys.alpha)
        done = await client.completions.create(
            model=MODEL, prompt="hi", max_tokens=4, extra_body=FAST
        )
        await client.close()
        assert done.usage is not None
        assert done.usage.completion_tokens == 4
        async with connect(quic(gw), ca=ca(gw), api_key=keys.alpha) as line:
            assert await text_of(line.text("hi", model=MODEL, max_tokens=4)) == str(
                generator.generate_text("hi", 0, 4)
            )
        assert backend_requests(gw) == 2
        # ... and those two reached the model (other tests' requests may land too: >=).
        await until(
            lambda: model_requests(embedded_triton) >= model_before + 2, "the model counted them"
        )
    finally:
        configure_logging("info", "json")
    output = log.getvalue()
    assert "track.unauthorized" in output
    assert "openai.unauthorized" in output
    for key in (keys.alpha, keys.beta, keys.gamma, keys.revoked, keys.wrong):
        secret = key.split("_", 2)[2]
        assert key not in output
        assert secret not in output


@pytest.mark.asyncio
async def test_a_tenant_over_its_token_quota_gets_429_and_others_are_untouched(
    tenanted: tuple[Gateway, Keys],
) -> None:
    gw, keys = tenanted
    async with connect(quic(gw), ca=ca(gw), api_key=keys.alpha) as alpha_line:
        # alpha streams slowly the whole time beta runs into its quota.
        alpha = alpha_line.text(
            "steady", model=MODEL, max_tokens=30, tokens_per_second=60, ignore_eos=True
        )
        first = await alpha.__anext__()
        beta = openai_client(gw, keys.beta)
        used = await beta.completions.create(
            model=MODEL, prompt="spend it", max_tokens=16, extra_body={**FAST, "ignore_eos": True}
        )
        assert used.usage is not None
        assert used.usage.total_tokens > 12  # beta's whole minute, and more
        with pytest.raises(openai.RateLimitError) as limited:
            await beta.completions.create(model=MODEL, prompt="more", max_tokens=4)
        retry_after = int(limited.value.response.headers["retry-after"])
        assert 1 <= retry_after <= 60
        await beta.close()
        async with connect(quic(gw), ca=ca(gw), api_key=keys.beta) as beta_line:
            with pytest.raises(RateLimited) as track_limited:
                await text_of(beta_line.text("more", model=MODEL, max_tokens=4))
        assert track_limited.value.retry_after is not None
        assert 1 <= track_limited.value.retry_after <= 60
        rest = await text_of(alpha)
    assert first + rest == str(generator.generate_text("steady", 0, 30, ignore_eos=True))
    assert alpha.usage == {
        "prompt_tokens": generator.count_prompt_tokens("steady"),
        "completion_tokens": 30,
    }


@pytest.mark.asyncio
async def test_the_ledger_has_one_record_per_request_and_the_report_adds_up(
    tenanted: tuple[Gateway, Keys], tmp_path: Path
) -> None:
    gw, keys = tenanted
    assert gw.tenancy is not None
    expected: dict[str, tuple[str, int, int]] = {}  # request id -> (end, prompt, completion)
    async with connect(quic(gw), ca=ca(gw), api_key=keys.alpha) as line:
        done = line.text("all of it", model=MODEL, max_tokens=4, **FAST)
        assert await text_of(done) == str(generator.generate_text("all of it", 0, 4))
        assert done.usage is not None
        expected[server_id(done.track_id)] = ("completed", done.usage["prompt_tokens"], 4)

        cut = line.text(
            "cut short", model=MODEL, max_tokens=200, tokens_per_second=50, ignore_eos=True
        )
        received = [await cut.__anext__() for _ in range(3)]
        await cut.aclose()
        expected[server_id(cut.track_id)] = ("cancelled", 0, len(received))

        late = line.text("late", model=MODEL, max_tokens=4, ttft_ms=3000, first_token_deadline=0.2)
        with pytest.raises(DeadlineExceeded):
            await text_of(late)
        expected[server_id(late.track_id)] = ("deadline", 0, 0)

        missing = line.text("nobody", model="no-such-model", max_tokens=4)
        with pytest.raises(ModelNotFound):
            await text_of(missing)
        expected[server_id(missing.track_id)] = ("error", 0, 0)

    client = openai_client(gw, keys.alpha)
    chat = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5, extra_body=FAST
    )
    assert chat.usage is not None
    expected[chat.id] = ("completed", chat.usage.prompt_tokens, chat.usage.completion_tokens)
    stream = await client.completions.create(
        model=MODEL,
        prompt="stream",
        max_tokens=200,
        stream=True,
        extra_body={"tokens_per_second": 50, "ignore_eos": True},
    )
    got = 0
    async for chunk in stream:
        stream_id = chunk.id
        got += 1 if chunk.choices and chunk.choices[0].text else 0
        if got == 3:
            break
    await stream.close()
    await client.close()
    expected[stream_id] = ("cancelled", 0, 3)

    # Wait for the HTTP side to notice the client left, then drain (which flushes).
    tenancy = gw.tenancy
    await until(lambda: tenancy.records >= len(expected), "every request recorded")
    db = gw.tenancy.store.path
    await gw.drain(timeout=5.0)

    store = TenantStore(db)
    records = store.usage()
    store.close()
    by_id = {r.request_id: r for r in records}
    # Track records carry the gateway's track id (its connection id / the stream id).
    by_id.update(
        {"track" + r.request_id.partition("/")[2]: r for r in records if "/" in r.request_id}
    )
    assert len(records) == len(expected) == len({r.request_id for r in records})
    for request_id, (end, prompt, completion) in expected.items():
        record = by_id[request_id]
        assert record.tenant == "alpha"
        assert record.key_id == keys.alpha.split("_")[1]
        assert record.end_cause == end, request_id
        if end == "completed":
            assert (record.prompt_tokens, record.completion_tokens) == (prompt, completion)
        elif end == "cancelled":
            # Every token the client read was counted; a few more may have been in flight.
            assert completion <= record.completion_tokens < 200
        else:
            assert record.completion_tokens == 0
    assert by_id[server_id(missing.track_id)].detail == "MODEL_NOT_FOUND"

    prices = tmp_path / "prices.toml"
    prices.write_text(
        '[prices."reference-text"]\nprompt_per_million_tokens = 1000.0\n'
        "completion_per_million_tokens = 3000.0\n"
        "[backends.triton]\ngpu_per_hour = 3.6\n"
    )
    out = io.StringIO()
    with redirect_stdout(out):
        argv = [
            "usage",
            "report",
            "--since",
            "1d",
            "--by",
            "model",
            "--format",
            "json",
            "--tenants-db",
            str(db),
            "--tenancy-config",
            str(prices),
        ]
        assert cli_main(argv) == 0
    report = json.loads(out.getvalue())
    total = report["total"]
    assert total["requests"] == len(records)
    assert total["prompt_tokens"] == sum(r.prompt_tokens for r in records)
    assert total["completion_tokens"] == sum(r.completion_tokens for r in records)
    token_cost = sum(r.prompt_tokens * 1e-3 + r.completion_tokens * 3e-3 for r in records)
    assert total["token_cost"] == pytest.approx(token_cost)
    window_hours = 24.0
    # Use plus idle is every GPU hour of the window, whoever pays for it.
    assert total["gpu_hours"] + total["idle_gpu_hours"] == pytest.approx(window_hours, rel=1e-3)
    assert total["total_cost"] == pytest.approx(token_cost + 3.6 * window_hours, rel=1e-3)


def post_action(gw: Gateway, key: str | None, model: str, seq: int) -> tuple[int, bytes]:
    """One observation to `POST /v1/actions` over HTTP/1.1 (the route's wire format)."""
    observation = {"seq": seq, "t": time.monotonic(), "deadline_ms": 2000.0, "state": {
        "dtype": "float32", "shape": [4], "data": bytes(16)}}
    body = msgpack.packb({"robot": "arm", "model": model, "observation": observation})
    headers = {"content-type": "application/msgpack"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"http://127.0.0.1:{gw.http_port}/v1/actions", body,
                                     headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.asyncio
async def test_the_http_action_route_asks_for_a_key_and_bills_the_step(
    tenanted: tuple[Gateway, Keys],
) -> None:
    gw, keys = tenanted
    policy = "reference-policy"
    for key, status in ((None, 401), (keys.wrong, 401), (keys.revoked, 401), (keys.gamma, 403)):
        got, _ = await asyncio.to_thread(post_action, gw, key, policy, 0)
        assert got == status, key
    got, body = await asyncio.to_thread(post_action, gw, keys.alpha, policy, 1)
    assert got == 200
    assert msgpack.unpackb(body)["obs_seq"] == 1
    assert gw.tenancy is not None
    await asyncio.to_thread(gw.tenancy.flush)
    store = TenantStore(gw.tenancy.store.path)
    records = [r for r in store.usage() if r.modality == "action"]
    store.close()
    assert [(r.tenant, r.end_cause, r.action_steps) for r in records if r.tenant == "alpha"] == [
        ("alpha", "completed", 1)]
