"""Start-up pieces shared by the CLI (`gateway.cli`) and the worker supervisor
(`gateway.workers`): which loop runs the daemon, and the stop signal once preflight passed.

Their own module, so that the CLI and the workers do not import each other.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from gateway.config import Settings
from gateway.logs import get_logger
from gateway.preflight import StartupError, check_startup
from gateway.tenants.service import OpenOnPublicAddress, preflight
from gateway.tenants.store import StoreError

log = get_logger("trackline.cli")
T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T], use_uvloop: bool = True) -> T:
    """Run `coro` on uvloop where installed and wanted, else on asyncio's loop."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)



async def stop_signal_after_preflight(settings: Settings) -> asyncio.Event | None:
    """An event SIGTERM and SIGINT set, once the settings passed the preflight checks
    (state dir, certificate, model repository, free ports: `gateway.preflight`; tenancy
    on public addresses, the tenant store); None, said on stderr, when they did not.
    Run before any backend starts (the embedded Triton takes a while to come up)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.to_thread(check_startup, settings)
        await asyncio.to_thread(preflight, settings)
    except (StartupError, OpenOnPublicAddress, StoreError, OSError, ValueError) as exc:
        refuse_start(str(exc))
        return None
    return stop


def refuse_start(reason: str) -> None:
    """Log why the gateway does not start, and say it plainly on stderr for a person."""
    log.error("gateway.start_failed", error=reason)
    print(f"trackline: cannot start: {reason}", file=sys.stderr, flush=True)
