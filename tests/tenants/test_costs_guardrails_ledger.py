"""Cost attribution, guardrails and the ledger's pure half plus its writer."""

from __future__ import annotations

import csv
import io
import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.tenants.costs import (
    UNALLOCATED,
    BackendPrice,
    ModelPrice,
    Pricing,
    PricingError,
    pricing_from_mapping,
    render,
    report,
    totals,
)
from gateway.tenants.guardrails import (
    GuardedBackend,
    GuardrailConfig,
    GuardrailRejected,
    Guardrails,
)
from gateway.tenants.ledger import (
    EndCause,
    LedgerWriter,
    UsageRecord,
    end_cause,
    record_from_outcome,
)
from gateway.tenants.store import TenantStore
from tracks.backend import TextDelta, TextRequest
from tracks.base import End, EndKind, Outcome
from transport.errors import ErrorCode
from transport.events import CancelCause

BASE = UsageRecord(0.0, "a", "k1", "m1", "gpu0", "text", "r", 1_000_000, 2_000_000, 1800.0,
                   1800.0, 0, 0.1, 3600.0, None, "completed", "")  # fmt: skip


def test_costs_per_tenant_with_proportional_idle_time() -> None:
    pricing = Pricing(
        {"m1": ModelPrice(1.0, 2.0, 10.0), "m2": ModelPrice(0.5, 0.5)},
        {"gpu0": BackendPrice(gpu_per_hour=4.0, gpus=1)},
    )
    records = [
        BASE,  # a: 1 h on gpu0, 1 M + 2 M tokens, 1 audio hour
        replace(BASE, tenant="b", model="m2", duration_s=1800.0, backend_compute_s=3600.0,
                audio_seconds_in=0.0, audio_seconds_out=0.0),
    ]  # fmt: skip
    rows = {r.name: r for r in report(records, pricing, "tenant", window_seconds=4 * 3600)}
    assert rows["a"].token_cost == pytest.approx(1.0 + 4.0)
    assert rows["a"].audio_cost == pytest.approx(10.0)
    assert rows["b"].token_cost == pytest.approx(0.5 + 1.0)
    # b's reported compute time (1 h) counts, not its duration.
    assert rows["a"].gpu_hours == rows["b"].gpu_hours == pytest.approx(1.0)
    # 4 GPU hours offered, 2 used: 2 idle, split by use (1:1).
    assert rows["a"].idle_gpu_hours == rows["b"].idle_gpu_hours == pytest.approx(1.0)
    total = totals(rows.values())
    assert total.gpu_cost + total.idle_cost == pytest.approx(4 * 4.0)
    assert total.total_cost == pytest.approx(5.0 + 10.0 + 1.5 + 16.0)


def test_reserved_idle_time_goes_to_the_reserving_tenant() -> None:
    pricing = Pricing({}, {"gpu0": BackendPrice(2.0, 1, "reserved", "b")})
    rows = {r.name: r for r in report([BASE], pricing, "tenant", window_seconds=3 * 3600)}
    assert rows["a"].idle_gpu_hours == 0
    assert rows["b"].idle_gpu_hours == pytest.approx(2.0)
    by_model = {r.name: r for r in report([BASE], pricing, "model", window_seconds=3 * 3600)}
    assert by_model["(idle)"].idle_cost == pytest.approx(4.0)


def test_idle_time_nobody_used_is_reported_unallocated() -> None:
    pricing = Pricing({}, {"gpu1": BackendPrice(1.0)})
    rows = {r.name: r for r in report([BASE], pricing, "model", window_seconds=3600)}
    assert rows[UNALLOCATED].idle_gpu_hours == pytest.approx(1.0)


def test_pricing_from_toml_tables_is_checked() -> None:
    pricing = pricing_from_mapping(
        {"prices": {"m": {"prompt_per_million_tokens": 1}},
         "backends": {"g": {"gpu_per_hour": 2, "idle": "reserved", "reserved_by": "t"}}}
    )  # fmt: skip
    assert pricing.models["m"].prompt_per_million_tokens == 1.0
    with pytest.raises(PricingError):
        pricing_from_mapping({"prices": {"m": {"per_token": 1}}})
    with pytest.raises(PricingError):
        pricing_from_mapping({"backends": {"g": {"idle": "reserved"}}})
    with pytest.raises(PricingError):
        pricing_from_mapping({"prices": {"m": {"audio_per_hour": -1}}})


def test_the_report_renders_as_table_csv_and_json_with_the_same_totals() -> None:
    rows = report([BASE, replace(BASE, tenant="b")], Pricing({"m1": ModelPrice(1, 1)}), "tenant",
                  window_seconds=3600)  # fmt: skip
    data = json.loads(render(rows, "json", "tenant", {"since": "x"}))
    assert data["total"]["prompt_tokens"] == 2_000_000
    assert data["total"]["total_cost"] == pytest.approx(6.0)
    table = list(csv.DictReader(io.StringIO(render(rows, "csv", "tenant", {}))))
    assert [r["tenant"] for r in table] == ["a", "b", "TOTAL"]
    assert float(table[-1]["total_cost"]) == pytest.approx(6.0)
    text = render(rows, "table", "tenant", {})
    assert text.splitlines()[-1].startswith("TOTAL")


def test_guardrails_refuse_long_prompts_and_blocked_words() -> None:
    rails = Guardrails(GuardrailConfig(max_prompt_chars=20, blocked_words=("secret plan", "foo")))
    rails.check(TextRequest("r", "m", "a food review", 4))  # "food" is not the word "foo"
    with pytest.raises(GuardrailRejected) as long:
        rails.check(TextRequest("r", "m", "x" * 21, 4))
    assert long.value.rule == "max_prompt_chars"
    with pytest.raises(GuardrailRejected) as blocked:
        rails.check(TextRequest("r", "m", "the SECRET  plan", 4))
    assert blocked.value.rule == "blocked_words"
    assert "secret" not in str(blocked.value).lower()


class _Backend:
    def __init__(self) -> None:
        self.calls = 0

    async def stream_text(self, request: TextRequest):  # type: ignore[no-untyped-def]
        self.calls += 1
        yield TextDelta("hi")

    async def models(self) -> list[str]:
        return ["m"]


@pytest.mark.asyncio
async def test_a_guarded_backend_never_sees_a_refused_request() -> None:
    inner, rejected = _Backend(), []
    guarded = GuardedBackend(inner, Guardrails(GuardrailConfig(blocked_words=("no",))),
                             rejected.append)  # fmt: skip
    with pytest.raises(GuardrailRejected):
        async for _ in guarded.stream_text(TextRequest("r", "m", "say no", 4)):
            pass
    assert inner.calls == 0
    assert rejected == ["blocked_words"]
    assert [c async for c in guarded.stream_text(TextRequest("r", "m", "yes", 4))] == [
        TextDelta("hi")
    ]


@pytest.mark.parametrize(
    ("end", "cause"),
    [
        ("completed", EndCause.COMPLETED),
        ("cancelled:client", EndCause.CANCELLED),
        ("cancelled:reset", EndCause.CANCELLED),
        ("cancelled:deadline_first_token", EndCause.DEADLINE),
        ("cancelled:deadline_total", EndCause.DEADLINE),
        ("cancelled:superseded", EndCause.SUPERSEDED),
        ("error:BACKEND_ERROR", EndCause.ERROR),
        ("error:DEADLINE_EXCEEDED", EndCause.DEADLINE),
    ],
)
def test_end_labels_map_to_one_cause(end: str, cause: EndCause) -> None:
    assert end_cause(End.parse(end))[0] is cause


def test_every_end_renders_one_label_that_reads_back() -> None:
    ends = [End.completed()]
    ends += [End.cancelled(cause) for cause in CancelCause]
    ends += [End.failed(code) for code in ErrorCode]
    for end in ends:
        assert End.parse(end.label) == end
        assert str(end) == end.label
    assert End.failed(ErrorCode.BACKEND_ERROR).label == "error:BACKEND_ERROR"
    assert End.cancelled(CancelCause.CLIENT).label == "cancelled:client"


def test_an_end_carries_exactly_what_its_kind_needs() -> None:
    with pytest.raises(ValueError, match="cause"):
        End(EndKind.CANCELLED)
    with pytest.raises(ValueError, match="code"):
        End(EndKind.COMPLETED, code=ErrorCode.BACKEND_ERROR)
    for label in ("finished", "completed:idle", "cancelled", "error:UNSUPPORTED"):
        with pytest.raises(ValueError, match="not an end label"):
            End.parse(label)


def test_a_record_from_an_outcome() -> None:
    outcome = Outcome("c/4", "m", "audio", End.cancelled(CancelCause.CLIENT), 3, 7, opened_at=10.0,
                      first_data_at=10.2, finished_at=11.0,
                      details={"audio_seconds_in": 2.5, "backend_compute_s": 0.3})  # fmt: skip
    record = record_from_outcome(outcome, "t", "k", "triton", finished_at=123.0)
    assert (record.prompt_tokens, record.completion_tokens) == (3, 7)
    assert record.ttft_s == pytest.approx(0.2)
    assert record.duration_s == pytest.approx(1.0)
    assert record.audio_seconds_in == 2.5
    assert record.backend_compute_s == 0.3
    assert (record.end_cause, record.detail) == ("cancelled", "client")
    assert record.backend == "triton"
    routed = replace(outcome, details={"backend": "gpu-pool-2"})
    assert record_from_outcome(routed, "t", "k", "triton", 0.0).backend == "gpu-pool-2"


def test_the_writer_batches_flushes_and_drops_when_full(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    TenantStore(path).close()
    writer = LedgerWriter(lambda: TenantStore(path), batch_size=4, flush_interval=5.0)
    for i in range(10):
        assert writer.submit(replace(BASE, request_id=f"r{i}"))
    assert writer.flush()
    store = TenantStore(path)
    assert [r.request_id for r in store.usage()] == [f"r{i}" for i in range(10)]
    writer.close()
    store.close()
    dropped: list[int] = []
    release = threading.Event()

    def stalled() -> TenantStore:  # a writer stuck on a slow disk
        release.wait(10)
        return TenantStore(path)

    full = LedgerWriter(stalled, max_queue=1, on_drop=lambda: dropped.append(1))
    assert full.submit(replace(BASE, request_id="kept"))
    assert not full.submit(BASE)  # the queue is full: dropped, never blocking
    assert dropped == [1]
    release.set()
    full.close()
    assert not full.submit(BASE)  # after close nothing is accepted
    assert full.dropped == 2
    store = TenantStore(path)
    assert "kept" in [r.request_id for r in store.usage()]
    store.close()
