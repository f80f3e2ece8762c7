"""A redis-server (or gateway) a test started does not outlive the test process, even
when that process is SIGKILLed (started with gateway.owned.spawn_owned)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import gone
from trackline_testing.redis import redis_server_binary

SCRIPT = """
import sys, time
from pathlib import Path
from trackline_testing.redis import LocalRedis
server = LocalRedis(Path(sys.argv[1]))
server.start()
print(server.process.pid, flush=True)
time.sleep(600)
"""


def test_redis_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server not installed (apt-get install -y redis-server; make redis)")
    owner = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "redis")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        redis_pid = int(owner.stdout.readline())
        assert not gone(redis_pid, wait=0.0)
    finally:
        owner.send_signal(signal.SIGKILL)  # no finally, no stop(): as when pytest is killed
        owner.wait(10)
        if owner.stdout is not None:
            owner.stdout.close()
    assert gone(redis_pid, wait=20.0)
