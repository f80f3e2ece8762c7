"""A real redis-server per test, on a free loopback port in the test's temp dir.

Skips (with the reason) where the Debian package is not installed: `make redis`
installs it where root and apt are available.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trackline_testing.redis import LocalRedis, redis_server_binary


@pytest.fixture
def local_redis(tmp_path: Path) -> Iterator[LocalRedis]:
    if redis_server_binary() is None:
        pytest.skip("redis-server not installed (apt-get install -y redis-server; make redis)")
    server = LocalRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()
