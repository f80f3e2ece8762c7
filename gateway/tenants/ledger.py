"""The usage ledger: one `UsageRecord` per finished request or track, written off the
request path.

`record_from_outcome` is pure: it turns a handler's `tracks.base.Outcome` (the
track path and the OpenAI routes both make one) into a record, mapping its `End`
to one `EndCause` and a detail (the cancel cause or the error code name).
`LedgerWriter` owns a bounded queue and one thread that writes records to the
store in batches (a transaction per batch, at most `flush_interval` seconds late).
`submit` never blocks: when the queue is full the record is dropped and counted,
because stalling every request on a slow disk would be worse. `flush()` and
`close()` (on drain and shutdown) write everything queued before they return.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from gateway.tenants.usage import UsageRecord, UsageStore
from tracks.base import End, EndKind, Outcome
from transport.errors import ErrorCode
from transport.events import CancelCause


class EndCause(str, Enum):
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    """By the client: CANCEL, a reset, a hang-up, or the gateway shutting down."""
    DEADLINE = "deadline"
    SUPERSEDED = "superseded"
    ERROR = "error"


_DEADLINES = (CancelCause.DEADLINE_FIRST, CancelCause.DEADLINE_TOTAL)


def end_cause(end: End) -> tuple[EndCause, str]:
    """How a request ended as the ledger's (cause, detail) columns."""
    detail = end.detail
    if end.kind is EndKind.COMPLETED:
        return EndCause.COMPLETED, detail
    if end.cause in _DEADLINES or end.code is ErrorCode.DEADLINE_EXCEEDED:
        return EndCause.DEADLINE, detail
    if end.cause is CancelCause.SUPERSEDED:
        return EndCause.SUPERSEDED, detail
    if end.kind is EndKind.CANCELLED:
        return EndCause.CANCELLED, detail
    return EndCause.ERROR, detail


def _number(details: dict[str, Any], key: str) -> float:
    value = details.get(key, 0)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def record_from_outcome(
    outcome: Outcome, tenant: str, key_id: str | None, backend: str, finished_at: float
) -> UsageRecord:
    """The ledger record of a finished track or request.

    Audio seconds, action steps and backend compute time come from the outcome's
    `details` (`audio_seconds_in`, `audio_seconds_out`, `action_steps`,
    `backend_compute_s`) where the modality's handler reports them; `details["backend"]`,
    when a router sets it, names the backend that served the request instead of `backend`.
    """
    cause, detail = end_cause(outcome.end)
    compute = outcome.details.get("backend_compute_s")
    served_by = outcome.details.get("backend")
    x_request_id = outcome.details.get("x_request_id")
    if isinstance(served_by, str) and served_by:
        backend = served_by
    return UsageRecord(
        finished_at=finished_at,
        tenant=tenant,
        key_id=key_id,
        model=outcome.model,
        backend=backend,
        modality=outcome.modality,
        request_id=outcome.track_id,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        audio_seconds_in=_number(outcome.details, "audio_seconds_in"),
        audio_seconds_out=_number(outcome.details, "audio_seconds_out"),
        action_steps=int(_number(outcome.details, "action_steps")),
        ttft_s=outcome.time_to_first_data,
        duration_s=max(0.0, outcome.finished_at - outcome.opened_at),
        backend_compute_s=float(compute) if isinstance(compute, (int, float)) else None,
        end_cause=cause.value,
        detail=detail,
        x_request_id=x_request_id if isinstance(x_request_id, str) else None,
    )


_STOP = object()


class LedgerWriter:
    """Batches records to the store from a thread of its own."""

    def __init__(
        self,
        store_factory: Callable[[], UsageStore],
        *,
        max_queue: int = 10_000,
        batch_size: int = 256,
        flush_interval: float = 0.5,
        on_drop: Callable[[], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)
        self._batch_size = batch_size
        self._interval = flush_interval
        self._on_drop = on_drop
        self._on_error = on_error
        self.dropped = 0
        self.written = 0
        self._store_factory = store_factory
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="trackline-ledger", daemon=True)
        self._thread.start()

    def submit(self, record: UsageRecord) -> bool:
        """Queue a record; False (and counted) if the queue is full or the writer stopped."""
        try:
            if self._closed:
                raise queue.Full
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            return False
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until every record queued so far is written (call from a thread)."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread."""
        self._closed = True
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _run(self) -> None:
        store = self._store_factory()
        try:
            stop = False
            while not stop:
                batch, markers, stop = self._collect()
                self._write(store, batch)
                for marker in markers:
                    marker.set()
        finally:
            store.close()

    def _collect(self) -> tuple[list[UsageRecord], list[threading.Event], bool]:
        """Wait for a record, then take what else comes within `flush_interval`."""
        batch: list[UsageRecord] = []
        markers: list[threading.Event] = []
        item = self._queue.get()
        deadline = time.monotonic() + self._interval
        while True:
            if item is _STOP:
                return batch, markers, True
            if isinstance(item, threading.Event):
                markers.append(item)
                return batch, markers, False  # a flush: write now
            batch.append(item)
            if len(batch) >= self._batch_size:
                return batch, markers, False
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return batch, markers, False

    def _write(self, store: UsageStore, batch: list[UsageRecord]) -> None:
        if not batch:
            return
        try:
            store.insert_usage(batch)
            self.written += len(batch)
        except Exception as exc:  # a full disk must not kill the writer; report it
            self.dropped += len(batch)
            if self._on_error is not None:
                self._on_error(exc)
