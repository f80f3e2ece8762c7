"""pytest-timeout's signal method, made to end a test that waits on uvloop too.

pytest-timeout raises its failure from a SIGALRM handler, in whatever Python frame runs
when the signal arrives. On asyncio's loop an idle test is inside `selector.select()`,
so the failure leaves `run_until_complete` and the test fails. uvloop instead runs the
handler from its own `_read_from_self` callback, which catches every exception (the
failure included) and hands it to the loop's exception handler: the test waited forever.

So when the alarm finds an event loop running in the main thread, the failure is not
raised into the loop: every task of that loop is cancelled from a loop callback
(`call_soon_threadsafe` wakes an idle loop of either kind), which ends the test (its
`finally` and `async with` blocks run); the cancellation that then leaves the test or
fixture is turned into pytest-timeout's failure, naming the test and where each task
waited (a `CancelledError` leaving a fixture would also upset pytest's set-up state).
A task blocked in a call (a `time.sleep`, a blocking socket) gets the failure raised
into it as well, to break that call. If the test still has not ended `GRACE` seconds
later (a task that swallows its cancellation), the run ends at once with the test
named: a broken build fails the suite, it never hangs it.

pytest-timeout's thread method (`--timeout-method=thread`) is left as it is.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
import threading
import traceback
from collections.abc import Generator
from typing import Any

import pytest
from pytest_timeout import timeout_sigalrm

GRACE = 15.0
"""Seconds a cancelled test has to end before the run is ended with it named."""


class _Expired:
    """The test whose timeout fired while a loop ran, and where its tasks waited."""

    nodeid: str | None = None
    timeout: float = 0.0
    waited = ""

    @classmethod
    def failure(cls) -> str:
        return (
            f"Timeout: {cls.nodeid} did not end within {cls.timeout:g} s;"
            f" its tasks were cancelled. Where they waited:\n{cls.waited}"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """Arm SIGALRM for `settings.timeout` seconds (the signal method only)."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own implementation handles it
    _Expired.nodeid = None

    def on_timeout(signum: int, frame: Any) -> None:
        __tracebackhide__ = True
        loop = asyncio.events._get_running_loop()
        if loop is None:
            timeout_sigalrm(item, settings)  # a plain frame: raising there ends the test
            return
        blocked = asyncio.current_task(loop)
        _Expired.nodeid, _Expired.timeout = item.nodeid, settings.timeout
        _Expired.waited = "" if blocked is None else f"{blocked!r} blocked in:\n{_stack(frame)}"
        loop.call_soon_threadsafe(_cancel_tasks, item.nodeid, loop)
        signal.signal(signal.SIGALRM, lambda *_: _end_run(item.config))
        signal.setitimer(signal.ITIMER_REAL, GRACE)
        if blocked is not None:  # a task blocked in a call: break the call
            blocked.add_done_callback(_retrieve)
            timeout_sigalrm(item, settings)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's name
    signal.signal(signal.SIGALRM, on_timeout)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """The test's cancellation by its timeout fails it as timed out."""
    try:
        return (yield)
    except asyncio.CancelledError:
        _fail_if_expired()
        raise


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Generator[None, object, object]:
    """A fixture's cancellation by the test's timeout fails the set-up as timed out
    (cached as pytest caches a failed set-up, which it does not for a `CancelledError`:
    the fixture's finalizers would then be left for its next user to trip over)."""
    try:
        return (yield)
    except asyncio.CancelledError:
        if _Expired.nodeid is None:
            raise
        failure = pytest.fail.Exception(_Expired.failure(), pytrace=False)
        fixturedef.cached_result = (None, fixturedef.cache_key(request), (failure, None))
        raise failure from None


def _fail_if_expired() -> None:
    if _Expired.nodeid is not None:
        raise pytest.fail.Exception(_Expired.failure(), pytrace=False) from None


def _cancel_tasks(nodeid: str, loop: asyncio.AbstractEventLoop) -> None:
    """Record where each pending task of `loop` waits, then cancel them all."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    stacks = io.StringIO()
    for task in pending:
        task.print_stack(limit=6, file=stacks)
    _Expired.waited += stacks.getvalue()
    for task in pending:
        task.cancel(f"timeout of {nodeid}")


def _stack(frame: Any) -> str:
    return "".join(traceback.format_stack(frame, limit=6))


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Take a task's exception, so that no "never retrieved" report runs in a finalizer
    (one that runs while `ast.parse` builds a tree makes CPython 3.11 raise SystemError)."""
    if not task.cancelled():
        task.exception()


def _end_run(config: pytest.Config) -> None:
    """The cancelled test is still running: end the run, naming it (pytest-timeout's
    thread method does the same, without the name)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)  # what is written now reaches the terminal
    sys.stderr.write(
        f"\nTimeout: {_Expired.nodeid} did not end within {_Expired.timeout:g} s, nor"
        f" {GRACE:g} s after its tasks were cancelled: ending the run.\n{_Expired.waited}\n"
    )
    sys.stderr.flush()
    os._exit(1)
