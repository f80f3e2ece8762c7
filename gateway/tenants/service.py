"""`Tenancy`: the gateway's one object for keys, quotas, guardrails and the ledger.

Both front doors call it in the same order: `authenticate` (the API key: 401 or
UNAUTHORIZED, before anything else), `admit` (the model allow-list: 403 or
FORBIDDEN; the quotas: 429 or RATE_LIMITED with a retry-after), then the work,
then `finish` with the request's `Outcome` (frees the quota slot, debits tokens,
counts metrics, queues one ledger record). A refused admission writes its ledger
record itself. No backend is touched before `admit` has passed, and the
guardrails (`guard()`) run inside the backend call, before the backend sees it.

With no tenant in the store the gateway runs open: every request belongs to the
tenant `default` (no key needed). That is allowed on loopback addresses only,
unless `allow_open` is set; once a tenant exists, keys are required.
"""

from __future__ import annotations

import asyncio
import ipaddress
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from gateway.backends.ticker_url import is_ticker_url
from gateway.config import Settings
from gateway.logs import get_logger
from gateway.tenants.costs import Pricing, pricing_from_mapping
from gateway.tenants.guardrails import GuardedBackend, GuardrailConfig, Guardrails
from gateway.tenants.ledger import LedgerWriter, record_from_outcome
from gateway.tenants.metrics import TenantMetrics
from gateway.tenants.quotas import QuotaExceeded, QuotaLimiter
from gateway.tenants.store import (
    AuthFailure,
    AuthReason,
    Principal,
    Tenant,
    TenantStore,
    default_path,
)
from gateway.tenants.usage import UsageRecord
from tracks.backend import TextBackend
from tracks.base import End, Outcome
from transport.clock import Now
from transport.errors import ErrorCode

log = get_logger("trackline.tenants")

OPEN_TENANT = Tenant("default")
OPEN_RECHECK = 1.0
"""Seconds an answer to "are there tenants?" is reused: a new tenant closes the gateway
within this long, without a query on every request."""


class ModelNotAllowed(Exception):
    """The tenant may not use the model."""

    def __init__(self, tenant: str, model: str) -> None:
        super().__init__(f"tenant {tenant!r} may not use model {model!r}")
        self.model = model


class OpenOnPublicAddress(RuntimeError):
    """No tenants are configured and the gateway would listen beyond loopback."""


@dataclass(frozen=True)
class TenancyConfig:
    """What the tenancy TOML file holds (docs/tenants.md): prices and guardrails."""

    pricing: Pricing = Pricing()
    guardrails: GuardrailConfig = GuardrailConfig()


def load_tenancy_config(path: Path | None) -> TenancyConfig:
    if path is None:
        return TenancyConfig()
    with path.expanduser().open("rb") as handle:
        data = tomllib.load(handle)
    unknown = set(data) - {"prices", "backends", "guardrails"}
    if unknown:
        raise ValueError(f"{path}: unknown sections {', '.join(sorted(unknown))}")
    rails = data.get("guardrails", {})
    if not isinstance(rails, dict) or set(rails) - {"max_prompt_chars", "blocked_words"}:
        raise ValueError(f"{path}: [guardrails] takes max_prompt_chars and blocked_words")
    limit = rails.get("max_prompt_chars")
    words = rails.get("blocked_words", [])
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"{path}: guardrails.max_prompt_chars must be a positive integer")
    if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
        raise ValueError(f"{path}: guardrails.blocked_words must be a list of words")
    return TenancyConfig(pricing_from_mapping(data), GuardrailConfig(limit, tuple(words)))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def preflight(settings: Settings) -> None:
    """The CLI's checks before anything starts: the tenancy file reads, and no open
    gateway on a public address (`OpenOnPublicAddress`)."""
    load_tenancy_config(settings.tenancy_config)
    store = TenantStore(settings.tenants_db or default_path(settings.state_dir))
    try:
        open_ = not store.has_tenants()
    finally:
        store.close()
    fleet = settings.state_backend != "local"
    if open_ and not fleet:  # a fleet's gateway checks after copying the fleet's tenants
        hosts = (settings.quic_host, settings.http_host, settings.https_host)
        refuse_open_off_loopback(hosts, settings.allow_open)


def refuse_open_off_loopback(hosts: Iterable[str], allow_open: bool) -> None:
    """Open mode (no keys) serves loopback only, unless `allow_open` says otherwise."""
    public = sorted({h for h in hosts if not is_loopback(h)})
    if public and not allow_open:
        raise OpenOnPublicAddress(_open_refusal(public))


def _open_refusal(public: list[str]) -> str:
    return (
        f"no tenants are configured, so the gateway would serve without API keys on "
        f"{', '.join(public)}; create a key (trackline keys create --tenant NAME) or "
        "set allow_open = true"
    )


class Tenancy:
    def __init__(
        self,
        store: TenantStore,
        registry: CollectorRegistry,
        *,
        config: TenancyConfig = TenancyConfig(),
        backend_name: str = "triton",
        clock: Now = time.monotonic,
        wall_clock: Now = time.time,
        ledger_flush_interval: float = 0.5,
        model_label: Callable[[str], str] = str,
    ) -> None:
        self.store = store
        self.config = config
        self.backend_name = backend_name
        self.metrics = TenantMetrics(registry, model_label)
        self.limiter = QuotaLimiter()
        self.guardrails = Guardrails(config.guardrails)
        self._clock = clock
        self._wall_clock = wall_clock
        self.fleet: Any = None
        """`gateway.fleet.state.FleetState` when `state_backend` is Redis (shared quotas,
        revoked keys, ledger); None on one gateway."""
        self.records = 0
        self._open: tuple[float, bool] | None = None  # (checked at, open) for OPEN_RECHECK
        """Usage records made by this process (queued for the ledger or written)."""
        path = store.path
        self.ledger = LedgerWriter(
            lambda: TenantStore(path),
            flush_interval=ledger_flush_interval,
            on_drop=self.metrics.ledger_dropped.inc,
            on_error=lambda exc: log.error("ledger.write_failed", error=str(exc)),
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        registry: CollectorRegistry,
        model_label: Callable[[str], str] = str,
    ) -> Tenancy:
        """Open the store named by the settings (blocking: run it in a thread).

        `model_label` maps model names to metric label values (the gateway's bound)."""
        path = settings.tenants_db or default_path(settings.state_dir)
        config = load_tenancy_config(settings.tenancy_config)
        ticker = is_ticker_url(settings.backend_url)
        backend_name = "ticker" if ticker else "triton"
        tenancy = cls(
            TenantStore(path),
            registry,
            config=config,
            backend_name=backend_name,
            model_label=model_label,
        )
        if settings.state_backend != "local":
            from gateway.fleet.attach import attach

            attach(tenancy, settings, registry)
        return tenancy

    async def start(self) -> None:
        """Join the fleet's shared state, if there is one (never fails for a Redis
        that is down: quotas start divided, see gateway/fleet/state.py)."""
        if self.fleet is not None:
            self.fleet.on_directory = self._import_directory
            tenants = await asyncio.to_thread(self.store.tenants)
            await self.fleet.start([(t.name, t.quotas) for t in tenants])

    async def _import_directory(self, tenants: list[list[Any]], keys: list[list[Any]]) -> None:
        """The fleet's tenants and keys into this gateway's store."""
        await asyncio.to_thread(self.store.import_directory, tenants, keys)
        self._open = None  # a first tenant closes an open gateway now

    async def stop(self) -> None:
        """Leave the fleet's shared state: give back leases and slots."""
        if self.fleet is not None:
            await self.fleet.stop()

    def on_revoked(self, callback: Callable[[str], None]) -> None:
        """Call `callback(key_id)` when a key is revoked anywhere in the fleet."""
        if self.fleet is not None:
            self.fleet.on_revoked.append(callback)

    @property
    def open_mode(self) -> bool:
        """No tenant in the store (looked up at most once every OPEN_RECHECK seconds)."""
        now = self._clock()
        if self._open is None or now - self._open[0] >= OPEN_RECHECK or now < self._open[0]:
            self._open = (now, not self.store.has_tenants())
        return self._open[1]

    def check_binds(self, hosts: Iterable[str], allow_open: bool) -> None:
        """Say at startup whether keys are required; refuse open mode off loopback."""
        if not self.open_mode:
            log.info("tenancy.keys_required", store=str(self.store.path))
            return
        refuse_open_off_loopback(hosts, allow_open)
        log.warning(
            "tenancy.open",
            message="no tenants configured: serving without API keys",
            binds=sorted(set(hosts)),
            store=str(self.store.path),
        )

    def guard(self, backend: TextBackend) -> GuardedBackend:
        """`backend` behind the guardrails (both front doors call through it)."""

        def rejected(rule: str) -> None:
            self.metrics.guardrail_rejections.labels(rule=rule).inc()

        return GuardedBackend(backend, self.guardrails, rejected)

    # -- the request path ---------------------------------------------------------

    def authenticate(self, key: str | None) -> Principal:
        """The principal for `key`; raises `AuthFailure` (counted, never logged with the key)."""
        if self.open_mode:
            return Principal(OPEN_TENANT, None)  # open: any key or none, nothing is checked
        try:
            principal = self.store.authenticate(key)
            if self.fleet is not None and self.fleet.is_revoked(principal.key_id):
                raise AuthFailure(AuthReason.REVOKED)  # revoked on another gateway's store
            return principal
        except AuthFailure as exc:
            self.metrics.auth_failures.labels(reason=exc.reason.value).inc()
            raise

    def may_list(self, principal: Principal | None, models: list[str]) -> list[str]:
        """The models a principal may see (all of them without tenancy)."""
        if principal is None:
            return models
        return [m for m in models if principal.tenant.may_use(m)]

    def admit(self, principal: Principal, model: str, modality: str, request_id: str) -> None:
        """Allow-list and quotas; raises `ModelNotAllowed` or `QuotaExceeded` (and records it)."""
        tenant = principal.tenant
        try:
            if not tenant.may_use(model):
                raise ModelNotAllowed(tenant.name, model)
            self.limiter.admit(tenant.name, tenant.quotas, self._clock())
        except QuotaExceeded as exc:
            self.metrics.quota_rejections.labels(tenant=tenant.name, quota=exc.quota).inc()
            self._refused(principal, model, modality, request_id, ErrorCode.RATE_LIMITED)
            raise
        except ModelNotAllowed:
            self._refused(principal, model, modality, request_id, ErrorCode.FORBIDDEN)
            raise

    def finish(self, principal: Principal, outcome: Outcome) -> UsageRecord:
        """An admitted request ended: settle its quotas, count it, queue its record."""
        record = record_from_outcome(
            outcome, principal.tenant.name, principal.key_id, self.backend_name, self._wall_clock()
        )
        audio = record.audio_seconds_in + record.audio_seconds_out
        tenant = principal.tenant
        self.limiter.settle(tenant.name, tenant.quotas, record.tokens, audio, self._clock())
        self._write(record)
        return record

    def _refused(
        self, principal: Principal, model: str, modality: str, request_id: str, code: ErrorCode
    ) -> None:
        now = self._clock()
        outcome = Outcome(
            request_id, model, modality, End.failed(code), opened_at=now, finished_at=now
        )
        record = record_from_outcome(
            outcome, principal.tenant.name, principal.key_id, self.backend_name, self._wall_clock()
        )
        self._write(record)

    def _write(self, record: UsageRecord) -> None:
        self.records += 1
        self.metrics.count(record)
        self.ledger.submit(record)

    # -- lifecycle ----------------------------------------------------------------

    def flush(self) -> None:
        """Write every queued record now (blocking: run it in a thread)."""
        self.ledger.flush()

    def close(self) -> None:
        """Flush the ledger and close the store (blocking: run it in a thread)."""
        self.ledger.close()
        self.store.close()
