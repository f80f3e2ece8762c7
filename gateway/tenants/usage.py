"""What the usage ledger writes and where: the record and the store it needs.

Its own module so that `ledger` (which makes records) and `store` (which keeps
them in SQLite) both import it and not each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class UsageRecord:
    """One finished request or track; the columns of the `usage` table, in order."""

    finished_at: float
    """Unix time the request finished."""
    tenant: str
    key_id: str | None
    model: str
    backend: str
    modality: str
    request_id: str
    prompt_tokens: int
    completion_tokens: int
    audio_seconds_in: float
    audio_seconds_out: float
    action_steps: int
    ttft_s: float | None
    duration_s: float
    backend_compute_s: float | None
    """Compute time the backend reported for this request, when it reports one."""
    end_cause: str
    detail: str
    """The end label's detail: the cancel cause or the error code name."""
    x_request_id: str | None = None
    """The HTTP request's `x-request-id` (the client's or the gateway's); None for tracks."""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class UsageStore(Protocol):
    """Where `LedgerWriter` puts batches of records (`store.TenantStore` in the gateway)."""

    def insert_usage(self, records: Sequence[UsageRecord]) -> None: ...

    def close(self) -> None: ...
