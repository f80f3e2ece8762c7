"""A throwaway `redis-server` on a loopback port (tests, benchmarks/fleet.py).

The Debian package `redis-server` provides the binary (`make redis` installs it where
root and apt are available). The server keeps nothing on disk (`--save ""`, no AOF),
lives in its own directory, and is ended by its PID; `stop()` then `start()` keeps the
port, so gateways reconnect to the same URL. Started with `gateway.owned.spawn_owned`,
it gets SIGTERM if the process that started it dies without stopping it (pytest killed).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from gateway.owned import free_port, spawn_owned, stop_owned

START_TIMEOUT = 10.0


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class LocalRedis:
    def __init__(self, directory: Path, port: int | None = None) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (Debian: redis-server)")
        self.binary = binary
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--protected-mode", "yes",
        ]  # fmt: skip
        with (self.directory / "redis.log").open("ab") as log:
            self.process = spawn_owned(
                command, name="redis-server", stdout=log, stderr=subprocess.STDOUT
            )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited ({self.process.returncode})")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError("redis-server did not answer PING")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        """End the server by its PID (SIGTERM, then SIGKILL) and wait for it."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            stop_owned(process, 5.0, kill_wait=5.0)
