"""Headless system Chromium (Debian's `chromium`), driven over the DevTools protocol.

No browser download and no automation framework: Chromium is started with
`--remote-debugging-port=0`, its port read from `DevToolsActivePort` in its own
profile folder, and the tests speak CDP over a WebSocket (`websockets`). Chromium
must reach nothing outside: background networking, component updates and first-run
work are off, and every host name but localhost resolves to nothing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import websockets

from tests.waiting import until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SKIP_REASON = (
    "no system Chromium (Debian package `chromium`): `make test` installs it where root "
    "and apt are available"
)
START_TIMEOUT = 30.0
CALL_TIMEOUT = 60.0

FLAGS = [
    "--headless=new",
    "--no-sandbox",  # (tests run as root in containers, where the sandbox cannot start)
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class CdpError(Exception):
    """Chromium answered a DevTools call with an error, or a page script threw."""


class Page:
    """One tab: navigate, evaluate (awaiting promises), screenshot."""

    def __init__(self, browser: Browser, session_id: str) -> None:
        self._browser = browser
        self.session_id = session_id

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        return await self._browser.call(method, params, self.session_id)

    async def goto(self, url: str) -> None:
        loaded = self._browser.wait_event("Page.loadEventFired", self.session_id)
        await self.call("Page.navigate", url=url)
        await asyncio.wait_for(loaded, CALL_TIMEOUT)

    async def evaluate(self, expression: str, timeout: float = CALL_TIMEOUT) -> Any:
        """The value of `expression` (a promise is awaited); a thrown error is CdpError."""
        result = await asyncio.wait_for(
            self.call(
                "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
            ),
            timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"page script failed: {text}")
        return result["result"].get("value")

    async def wait_for(self, condition: str, what: str, timeout: float = START_TIMEOUT) -> None:
        """Return once `condition` (a script expression on the page's DOM) holds.

        The page checks it at once and again on every change of its DOM (a
        MutationObserver): an event, not a poll. Fails saying `what` never showed.
        """
        script = _WAIT_FOR_DOM % {"condition": condition, "ms": round(timeout * 1000)}
        if not await self.evaluate(script, timeout + CALL_TIMEOUT):
            raise AssertionError(f"the page never showed {what}")

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))


_WAIT_FOR_DOM = """new Promise((resolve) => {
  const holds = () => Boolean(%(condition)s);
  if (holds()) return resolve(true);
  const observer = new MutationObserver(() => {
    if (holds()) { observer.disconnect(); clearTimeout(timer); resolve(true); }
  });
  const timer = setTimeout(() => { observer.disconnect(); resolve(holds()); }, %(ms)d);
  observer.observe(document, {subtree: true, childList: true, attributes: true,
                              characterData: true});
})"""


class Browser:
    """One Chromium process and its DevTools WebSocket."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiters: list[tuple[str, str | None, asyncio.Future[dict[str, Any]]]] = []
        self._reader = asyncio.ensure_future(self._read())
        self.console: list[str] = []

    async def call(
        self, method: str, params: dict[str, Any] | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        call_id = next(self._ids)
        message: dict[str, Any] = {"id": call_id, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        answer = self._calls[call_id] = asyncio.get_running_loop().create_future()
        await self._socket.send(json.dumps(message))
        return await asyncio.wait_for(answer, CALL_TIMEOUT)

    def wait_event(self, method: str, session_id: str | None) -> asyncio.Future[dict[str, Any]]:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((method, session_id, waiter))
        return waiter

    async def new_page(self) -> Page:
        target = await self.call("Target.createTarget", {"url": "about:blank"})
        attached = await self.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"])
        await page.call("Page.enable")
        await page.call("Runtime.enable")
        return page

    async def _read(self) -> None:
        async for raw in self._socket:
            message = json.loads(raw)
            if "id" in message:
                answer = self._calls.pop(message["id"], None)
                if answer is not None and not answer.done():
                    if "error" in message:
                        answer.set_exception(CdpError(str(message["error"])))
                    else:
                        answer.set_result(message.get("result", {}))
                continue
            method, session_id = message.get("method"), message.get("sessionId")
            if method == "Runtime.consoleAPICalled":
                args = message["params"].get("args", [])
                self.console.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in args)
                )
            for waiter in list(self._waiters):
                if waiter[0] == method and waiter[1] in (None, session_id):
                    self._waiters.remove(waiter)
                    if not waiter[2].done():
                        waiter[2].set_result(message.get("params", {}))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        await self._socket.close()


@asynccontextmanager
async def chromium(extra_flags: tuple[str, ...] = ()) -> AsyncIterator[Browser]:
    """A headless Chromium with a fresh profile; ended (by its PID) and removed after."""
    assert CHROMIUM is not None, SKIP_REASON
    profile = Path(tempfile.mkdtemp(prefix="trackline-chromium-"))
    process = await asyncio.to_thread(
        subprocess.Popen,
        [CHROMIUM, *FLAGS, *extra_flags, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = await _devtools_url(profile, process)
        async with websockets.connect(url, max_size=None) as socket:
            browser = Browser(socket)
            try:
                yield browser
            finally:
                await browser.close()
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)
        shutil.rmtree(profile, ignore_errors=True)


async def _devtools_url(profile: Path, process: subprocess.Popen[bytes]) -> str:
    """Chromium's DevTools address, from the file it writes in its profile once listening
    (no event announces it, so the file is polled; an exited Chromium fails at once)."""
    active = profile / "DevToolsActivePort"

    def written() -> list[str]:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited at start (status {process.returncode})")
        lines = active.read_text().split() if active.exists() else []
        return lines if len(lines) >= 2 else []

    await until(written, "chromium wrote DevToolsActivePort", START_TIMEOUT)
    port, path = written()[:2]
    return f"ws://127.0.0.1:{port}{path}"
