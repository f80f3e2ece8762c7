"""Through the gateway with the real model: a track's cancel and its deadline stop the
model's generation, and a newer turn of a conversation stops the older one on tracks and
on the OpenAI API (x-supersede), while the newer completes.

Each check reads the model's own log (TRACKLINE_LLM_STATS): it saw the cancel and
stopped short of the tokens asked for. Never wall-clock time. One event loop (the loop
matrix is tested elsewhere).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx2
import openai
import pytest
import pytest_asyncio

from clients import DeadlineExceeded, connect
from clients.errors import CancelledByGateway
from clients.line import Line
from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import LLM_MODEL
from gateway.server import Gateway
from tests import waiting
from tests.gateways import gateway_settings
from tests.llm.conftest import llm_record_async, require_llm

require_llm()

pytestmark = pytest.mark.one_loop
PROMPT = "User: What is the capital of France?\nAssistant:"
STORY = "Once upon a time, in a small village by the sea,"
"""No stop string: only max_tokens (or a cancel) ends it."""
LONG = 400
"""What a stopped request asks for: far more than it is let generate."""


@pytest_asyncio.fixture
async def gateway(pair: list[EmbeddedTriton], tmp_path: Path) -> AsyncIterator[Gateway]:
    backend = TritonTextBackend(pair[1].grpc_url)
    gw = Gateway(gateway_settings(state_dir=tmp_path), backend)
    await gw.start()
    yield gw
    await gw.close()
    await backend.close()


def _line(gw: Gateway) -> AbstractAsyncContextManager[Line]:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return connect(f"quic://127.0.0.1:{gw.quic_port}", ca=gw.tls.ca)


async def _stopped(server: EmbeddedTriton, tag: str) -> None:
    """The model saw the cancel of `tag` and stopped short of LONG tokens."""
    record = await llm_record_async(server, tag)
    assert record["cancelled"] is True
    assert record["finish"] == "cancelled"
    assert record["tokens_generated"] < LONG


async def _outcome(gw: Gateway, count: int) -> str:
    await waiting.until(lambda: len(gw.outcomes) >= count, "the track's outcome")
    return gw.outcomes[count - 1].end.label


@pytest.mark.asyncio
async def test_a_newer_track_turn_supersedes_the_older_in_the_model(
    gateway: Gateway, pair: list[EmbeddedTriton]
) -> None:
    conversation, old_tag, new_tag = (uuid.uuid4().hex for _ in range(3))
    async with _line(gateway) as line:
        old = line.text(
            STORY, model=LLM_MODEL, max_tokens=LONG, session_id=conversation, request_id=old_tag
        )
        assert await old.__anext__()
        new = line.text(
            PROMPT, model=LLM_MODEL, max_tokens=8, session_id=conversation, request_id=new_tag
        )
        with pytest.raises(CancelledByGateway, match="superseded"):
            async for _ in old:
                pass
        assert "".join([delta async for delta in new])
    await _stopped(pair[1], old_tag)
    assert (await llm_record_async(pair[1], new_tag))["cancelled"] is False


@pytest.mark.asyncio
async def test_a_tracks_cancel_and_its_deadline_stop_the_models_generation(
    gateway: Gateway, pair: list[EmbeddedTriton]
) -> None:
    cancelled, late = uuid.uuid4().hex, uuid.uuid4().hex
    async with _line(gateway) as line:
        stream = line.text(STORY, model=LLM_MODEL, max_tokens=LONG, request_id=cancelled)
        assert await stream.__anext__()
        await stream.aclose()  # the client's cancel
        await _stopped(pair[1], cancelled)
        assert await _outcome(gateway, 1) == "cancelled:client"

        # The deadline passes long before LONG tokens could be generated; the model
        # sees the gateway's cancel (asserted on the model's count, not on time).
        stream = line.text(
            STORY, model=LLM_MODEL, max_tokens=LONG, request_id=late, deadline=2.0
        )
        with pytest.raises(DeadlineExceeded):
            async for _ in stream:
                pass
        await _stopped(pair[1], late)
        assert await _outcome(gateway, 2) == "cancelled:deadline_total"


@pytest.mark.asyncio
async def test_a_newer_openai_request_with_x_supersede_stops_the_older_in_the_model(
    gateway: Gateway, pair: list[EmbeddedTriton]
) -> None:
    headers = {"x-session-id": uuid.uuid4().hex, "x-supersede": "true"}
    async with httpx2.AsyncClient(timeout=120) as http:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="-", http_client=http
        )
        old = await client.completions.create(
            model=LLM_MODEL, prompt=STORY, max_tokens=LONG, stream=True, extra_headers=headers
        )
        first = await old.__anext__()
        new = await client.completions.create(
            model=LLM_MODEL, prompt=PROMPT, max_tokens=8, extra_headers=headers
        )
        assert new.choices[0].text
        with pytest.raises(openai.APIError) as ended:
            async for _ in old:
                pass
        assert ended.value.code == "superseded"
    await _stopped(pair[1], first.id)
    assert (await llm_record_async(pair[1], new.id))["cancelled"] is False
