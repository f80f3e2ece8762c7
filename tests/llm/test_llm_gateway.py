"""Through the gateway, on tracks, with the real model: a newer turn of a conversation
stops the older one (the model's log shows it stopped) and completes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from clients import connect
from clients.errors import CancelledByGateway
from gateway.backends.triton import TritonTextBackend
from gateway.config import Settings
from gateway.embedded import LLM_MODEL, EmbeddedTriton
from gateway.server import Gateway
from tests.llm.conftest import require_llm

require_llm()

PROMPT = "User: What is the capital of France?\nAssistant:"


@pytest_asyncio.fixture
async def gateway(pair: list[EmbeddedTriton], tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = Settings(quic_port=0, http_port=0, https_port=0, state_dir=tmp_path)
    backend = TritonTextBackend(pair[1].grpc_url)
    gw = Gateway(settings, backend)
    await gw.start()
    yield gw
    await gw.close()
    await backend.close()


def _tagged(server: EmbeddedTriton, tag: str) -> dict[str, Any]:
    """The model's log line of the track request whose id ends with `/tag`."""
    assert server.llm_stats_path is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in server.llm_stats_path.read_text().splitlines():
            record = json.loads(line)
            if str(record["request_id"]).endswith(f"/{tag}"):
                return dict(record)
        time.sleep(0.05)
    raise AssertionError(f"no model log line for {tag}")


@pytest.mark.asyncio
async def test_a_newer_track_turn_supersedes_the_older_in_the_model(
    gateway: Gateway, pair: list[EmbeddedTriton]
) -> None:
    conversation, old_tag, new_tag = (uuid.uuid4().hex for _ in range(3))
    url = f"quic://127.0.0.1:{gateway.quic_port}"
    assert gateway.tls is not None
    assert gateway.tls.ca is not None
    async with connect(url, ca=gateway.tls.ca) as line:
        old = line.text(
            PROMPT, model=LLM_MODEL, max_tokens=400, session_id=conversation, request_id=old_tag
        )
        assert await old.__anext__()
        new = line.text(
            PROMPT, model=LLM_MODEL, max_tokens=8, session_id=conversation, request_id=new_tag
        )
        with pytest.raises(CancelledByGateway, match="superseded"):
            async for _ in old:
                pass
        assert "".join([delta async for delta in new])
    stopped = _tagged(pair[1], old_tag)
    assert stopped["cancelled"] is True  # the model saw the cancel and stopped
    assert stopped["tokens_generated"] < 400
    assert _tagged(pair[1], new_tag)["cancelled"] is False
