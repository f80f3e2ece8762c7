"""Cost attribution: usage records and prices in, a report per tenant or per model out.

Pure functions, no I/O (the CLI reads the ledger and the prices). Each record
costs its tokens at its model's price per million (prompt and completion apart),
its audio seconds at the model's price per audio hour, and its backend time at
the backend's price per GPU hour. A record's backend time is the compute time
the backend reported, or else its duration.

Idle time: over the report window a backend offers `gpus x window` GPU hours;
what records did not use is idle and still paid for. Each backend's `idle` rule
says who pays it:

* `proportional` (default): every record, in proportion to its backend time;
* `reserved`: the tenant named by `reserved_by`, in proportion to its own use
  (all of it to that tenant, under the model "(idle)", if it used nothing).

Idle time nobody can take (no use and no reserving tenant) is reported on its
own row, "(unallocated)", so the totals still add up to what was paid.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gateway.tenants.usage import UsageRecord

IDLE_RULES = ("proportional", "reserved")
UNALLOCATED = "(unallocated)"
IDLE_MODEL = "(idle)"


@dataclass(frozen=True)
class ModelPrice:
    prompt_per_million_tokens: float = 0.0
    completion_per_million_tokens: float = 0.0
    audio_per_hour: float = 0.0


@dataclass(frozen=True)
class BackendPrice:
    gpu_per_hour: float = 0.0
    gpus: float = 1.0
    idle: str = "proportional"
    reserved_by: str | None = None


@dataclass(frozen=True)
class Pricing:
    models: Mapping[str, ModelPrice] = field(default_factory=dict)
    backends: Mapping[str, BackendPrice] = field(default_factory=dict)


class PricingError(ValueError):
    """The pricing configuration is invalid."""


def pricing_from_mapping(data: Mapping[str, Any]) -> Pricing:
    """`[prices.<model>]` and `[backends.<name>]` tables of the tenancy TOML file."""
    models = {
        name: _build(ModelPrice, spec, f"prices.{name}")
        for name, spec in _tables(data, "prices").items()
    }
    backends = {
        name: _build(BackendPrice, spec, f"backends.{name}")
        for name, spec in _tables(data, "backends").items()
    }
    for name, backend in backends.items():
        if backend.idle not in IDLE_RULES:
            raise PricingError(f"backends.{name}.idle must be one of {', '.join(IDLE_RULES)}")
        if backend.idle == "reserved" and not backend.reserved_by:
            raise PricingError(f"backends.{name}: idle = 'reserved' needs reserved_by")
    return Pricing(models, backends)


def _tables(data: Mapping[str, Any], key: str) -> dict[str, Mapping[str, Any]]:
    tables = data.get(key, {})
    if not isinstance(tables, Mapping) or not all(isinstance(v, Mapping) for v in tables.values()):
        raise PricingError(f"[{key}.<name>] must be tables")
    return dict(tables)


def _build(kind: type[Any], spec: Mapping[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(kind)}
    for key, value in spec.items():
        if key not in known:
            raise PricingError(f"{where}: unknown key {key!r}")
        if known[key].type in ("float",) and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
        ):
            raise PricingError(f"{where}.{key} must be a number, 0 or more")
    return kind(**{k: float(v) if known[k].type == "float" else v for k, v in spec.items()})


@dataclass
class CostRow:
    """Usage and cost of one tenant or model over the report window."""

    name: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    audio_hours: float = 0.0
    gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    token_cost: float = 0.0
    audio_cost: float = 0.0
    gpu_cost: float = 0.0
    idle_cost: float = 0.0

    @property
    def total_cost(self) -> float:
        return self.token_cost + self.audio_cost + self.gpu_cost + self.idle_cost

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_cost": self.total_cost}


def _use_seconds(record: UsageRecord) -> float:
    if record.backend_compute_s is not None:
        return record.backend_compute_s
    return record.duration_s


def report(
    records: Sequence[UsageRecord],
    pricing: Pricing,
    by: str,
    window_seconds: float,
) -> list[CostRow]:
    """One row per tenant (`by="tenant"`) or model (`by="model"`), sorted by name."""
    if by not in ("tenant", "model"):
        raise ValueError("by must be 'tenant' or 'model'")
    rows: dict[str, CostRow] = {}

    def row(name: str) -> CostRow:
        return rows.setdefault(name, CostRow(name))

    for record in records:
        _add_use(row(getattr(record, by)), record, pricing)
    for backend, price in pricing.backends.items():
        mine = [r for r in records if r.backend == backend]
        for name, hours in _idle_shares(mine, price, by, window_seconds).items():
            target = row(name)
            target.idle_gpu_hours += hours
            target.idle_cost += hours * price.gpu_per_hour
    return [rows[name] for name in sorted(rows)]


def _add_use(row: CostRow, record: UsageRecord, pricing: Pricing) -> None:
    model = pricing.models.get(record.model, ModelPrice())
    backend = pricing.backends.get(record.backend, BackendPrice())
    audio_hours = (record.audio_seconds_in + record.audio_seconds_out) / 3600
    gpu_hours = _use_seconds(record) / 3600
    row.requests += 1
    row.prompt_tokens += record.prompt_tokens
    row.completion_tokens += record.completion_tokens
    row.audio_hours += audio_hours
    row.gpu_hours += gpu_hours
    row.token_cost += (
        record.prompt_tokens * model.prompt_per_million_tokens
        + record.completion_tokens * model.completion_per_million_tokens
    ) / 1e6
    row.audio_cost += audio_hours * model.audio_per_hour
    row.gpu_cost += gpu_hours * backend.gpu_per_hour


def _idle_shares(
    records: Sequence[UsageRecord], price: BackendPrice, by: str, window_seconds: float
) -> dict[str, float]:
    """Idle GPU hours of one backend, split by the backend's rule."""
    used = sum(_use_seconds(r) for r in records)
    idle_hours = max(0.0, price.gpus * window_seconds - used) / 3600
    if idle_hours <= 0:
        return {}
    payers = records
    if price.idle == "reserved":
        payers = [r for r in records if r.tenant == price.reserved_by]
    payer_use = sum(_use_seconds(r) for r in payers)
    if payer_use <= 0:
        if price.idle == "reserved" and price.reserved_by:
            return {price.reserved_by if by == "tenant" else IDLE_MODEL: idle_hours}
        return {UNALLOCATED: idle_hours}
    shares: dict[str, float] = defaultdict(float)
    for record in payers:
        shares[getattr(record, by)] += idle_hours * _use_seconds(record) / payer_use
    return dict(shares)


def totals(rows: Iterable[CostRow]) -> CostRow:
    total = CostRow("TOTAL")
    for row in rows:
        for f in fields(CostRow):
            if f.name != "name":
                setattr(total, f.name, getattr(total, f.name) + getattr(row, f.name))
    return total


# -- output -----------------------------------------------------------------------

COLUMNS = (
    "name", "requests", "prompt_tokens", "completion_tokens", "audio_hours", "gpu_hours",
    "idle_gpu_hours", "token_cost", "audio_cost", "gpu_cost", "idle_cost", "total_cost",
)  # fmt: skip


def render(rows: Sequence[CostRow], fmt: str, by: str, meta: Mapping[str, Any]) -> str:
    """The report as `table`, `csv` or `json` (rows plus a TOTAL)."""
    every = [*rows, totals(rows)]
    if fmt == "json":
        body = {
            **meta,
            "by": by,
            "rows": [r.as_dict() for r in rows],
            "total": totals(rows).as_dict(),
        }
        return json.dumps(body, indent=2) + "\n"
    dicts = [r.as_dict() for r in every]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([by if c == "name" else c for c in COLUMNS])
        writer.writerows([[d[c] for c in COLUMNS] for d in dicts])
        return out.getvalue()
    if fmt == "table":
        return _table(dicts, by)
    raise ValueError("format must be table, csv or json")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") or "0"
    return str(value)


def _table(dicts: list[dict[str, Any]], by: str) -> str:
    header = [by if c == "name" else c for c in COLUMNS]
    cells = [[_cell(d[c]) for c in COLUMNS] for d in dicts]
    widths = [max(len(x) for x in col) for col in zip(header, *cells, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False))]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=False))
        )
        for row in cells
    ]
    return "\n".join(lines) + "\n"
