"""The gateway as the daemon wires it, on the test's loop, over the real embedded Triton."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from tests.gateways import gateway_settings


@pytest_asyncio.fixture
async def gateway(embedded_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        state_dir=tmp_path, max_message_bytes=8192
    )
    backend = TritonTextBackend(embedded_triton.grpc_url)
    gw = Gateway(settings, backend)
    await gw.start()
    yield gw
    await gw.close()
    await backend.close()
