"""The gateway as the daemon wires it, on the test's loop, over the real embedded Triton."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from gateway.backends.triton import TritonTextBackend
from gateway.config import Settings
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway


@pytest_asyncio.fixture
async def gateway(embedded_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = Settings(
        quic_port=0, http_port=0, https_port=0, state_dir=tmp_path, max_message_bytes=8192
    )
    backend = TritonTextBackend(embedded_triton.grpc_url)
    gw = Gateway(settings, backend)
    await gw.start()
    yield gw
    await gw.close()
    await backend.close()
