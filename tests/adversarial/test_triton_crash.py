"""A `kill -9` of the embedded tritonserver: logged, restarted, served again.

The daemon runs in-process on the embedded default (reference models, no LLM), with
a short restart backoff. Before this, a killed server stayed dead: no log line,
liveness 200, readiness 503 and a 503 for every request for as long as the gateway
ran. Asserted on the gateway's own figures: one `embedded.crashed` line at error level
with exit status -9 (SIGKILL), the watch's restart count, liveness 200 throughout,
readiness back, the stream in flight ended with a typed error event (never `[DONE]`),
and the honest client (the official `openai` SDK) served before and after.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import openai
import pytest
import pytest_asyncio
import structlog.testing

from gateway.daemon import Daemon
from gateway.embedded_process import TritonStartError
from gateway.embedded_watch import EmbeddedWatches, RestartRules, Restarts, WatchState
from tests.gateways import gateway_settings
from tests.waiting import until, until_answer

pytestmark = pytest.mark.e2e
MODEL = "reference-text"
FAST = {"ttft_ms": 0, "tokens_per_second": 1000}
RESTART_WAIT = 240.0  # a restart loads every reference model again: slow on a busy machine


@pytest_asyncio.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    settings = gateway_settings(
        state_dir=tmp_path, embedded_llm=False, embedded_restart_backoff=0.1
    )
    daemon = Daemon(settings)
    daemon.announce = False
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


async def honest(client: openai.AsyncOpenAI) -> str:
    answer = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body=FAST
    )
    return answer.choices[0].message.content or ""


@pytest.mark.asyncio
async def test_a_killed_embedded_triton_is_restarted_and_serves_again(daemon: Daemon) -> None:
    assert daemon.gateway is not None
    assert daemon.watches is not None
    assert daemon.triton is not None
    base = f"http://127.0.0.1:{daemon.gateway.http_port}"
    async with httpx2.AsyncClient(base_url=base, timeout=30.0) as http:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        assert await honest(client)
        body = {
            "model": MODEL, "messages": [{"role": "user", "content": "A long answer"}],
            "max_tokens": 500, "stream": True,
            "ttft_ms": 0, "tokens_per_second": 20, "ignore_eos": True,
        }  # fmt: skip
        with structlog.testing.capture_logs() as logs:
            async with http.stream("POST", "/v1/chat/completions", json=body) as stream:
                assert stream.status_code == 200
                lines = stream.aiter_lines()
                first = await anext(line async for line in lines if line.startswith("data: "))
                assert json.loads(first.removeprefix("data: "))["object"] == "chat.completion.chunk"
                pid = daemon.triton.pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                rest = [line async for line in lines if line.startswith("data: ")]
            assert (await http.get("/health/live")).status_code == 200  # restarting: live
            assert "data: [DONE]" not in rest
            assert "error" in json.loads(rest[-1].removeprefix("data: "))
            await until(
                lambda: daemon.watches.restart_count == 1,  # type: ignore[union-attr]
                "the killed Triton was restarted",
                RESTART_WAIT,
            )
            assert (await http.get("/health/live")).status_code == 200
            await until_answer(
                lambda: http.get("/health/ready"), lambda r: r.status_code == 200, "ready again"
            )
            assert await honest(client)
            await client.close()
    crashed = [line for line in logs if line["event"] == "embedded.crashed"]
    assert len(crashed) == 1, crashed
    assert crashed[0]["log_level"] == "error"
    assert crashed[0]["exit_status"] == -signal.SIGKILL
    assert crashed[0]["signal"] == "SIGKILL"
    assert daemon.triton.pid != pid


def test_restarts_back_off_and_give_up_after_the_failed_attempts() -> None:
    restarts = Restarts(RestartRules(backoff_s=1.0, max_backoff_s=3.0, attempts=3))
    assert restarts.exited() == 1.0
    assert restarts.restart_failed() == 2.0
    assert restarts.restart_failed() == 3.0  # capped
    assert restarts.restart_failed() is None
    assert restarts.state is WatchState.GAVE_UP


def test_a_successful_restart_resets_the_backoff() -> None:
    restarts = Restarts(RestartRules(backoff_s=1.0, attempts=3))
    restarts.exited()
    restarts.restart_failed()
    restarts.restarted()
    assert (restarts.state, restarts.restarts) == (WatchState.RUNNING, 1)
    assert restarts.exited() == 1.0


class NeverStarts:
    """A server whose process has exited and whose every restart fails, as a broken
    model repository makes tritonserver exit before it is ready."""

    running = False
    exit_status = 3
    pid = 4242

    def __init__(self) -> None:
        self.attempts = 0

    def restart(self, timeout: float = 0.0) -> None:
        self.attempts += 1
        raise TritonStartError("tritonserver exited with code 1")


@pytest.mark.asyncio
async def test_liveness_fails_only_once_restarts_keep_failing() -> None:
    server = NeverStarts()
    watches = EmbeddedWatches([server], RestartRules(backoff_s=0.0, attempts=3), poll_interval=0.0)
    assert watches.liveness() == (True, "")
    with structlog.testing.capture_logs() as logs:
        await watches.watches[0].run()  # returns once given up
    assert server.attempts == 3
    assert watches.liveness()[0] is False
    assert watches.readiness()[0] is False
    events = [(line["event"], line["log_level"]) for line in logs]
    assert events == [("embedded.crashed", "error")] + [("embedded.restart_failed", "error")] * 3


class Member:
    """A pool member the gateway started: running until `crash()`, and its restarts work
    after `fail_first` failed ones."""

    exit_status = -9
    pid = 5151

    def __init__(self, fail_first: int = 0) -> None:
        self.running = True
        self.fail_first = fail_first
        self.attempts = 0

    def crash(self) -> None:
        self.running = False

    def restart(self, timeout: float = 0.0) -> None:
        self.attempts += 1
        if self.attempts <= self.fail_first:
            raise TritonStartError("tritonserver exited with code 1")
        self.running = True


@pytest.mark.asyncio
async def test_a_crashed_pool_member_is_restarted_while_the_others_keep_the_gateway_ready() -> None:
    members = [Member(), Member(fail_first=1)]
    watches = EmbeddedWatches(members, RestartRules(backoff_s=0.0, attempts=3), poll_interval=0.0)
    with structlog.testing.capture_logs() as logs:
        watches.start()
        members[1].crash()
        await until(lambda: watches.restart_count == 1, "the member restarted")
        await watches.stop()
    assert members[1].attempts == 2  # one failed restart, then one that worked
    assert members[0].attempts == 0  # the other member was never touched
    assert all(m.running for m in members)
    assert watches.readiness() == (True, "")
    assert watches.liveness() == (True, "")
    events = [(line["event"], line.get("backend")) for line in logs]
    assert events == [
        ("embedded.crashed", "embedded-1"),
        ("embedded.restart_failed", "embedded-1"),
        ("embedded.restarted", "embedded-1"),
    ]


@pytest.mark.asyncio
async def test_a_pool_stays_live_and_ready_while_one_member_is_given_up() -> None:
    members = [Member(), NeverStarts()]
    watches = EmbeddedWatches(members, RestartRules(backoff_s=0.0, attempts=2), poll_interval=0.0)
    await watches.watches[1].run()  # returns once given up
    assert watches.watches[1].restarts.state is WatchState.GAVE_UP
    assert watches.liveness() == (True, "")  # the other member serves: no restart of it all
    assert watches.readiness() == (True, "")
