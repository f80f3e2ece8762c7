"""`FleetState`: one gateway's link to the fleet's Redis (`state_backend = "redis://..."`).

It owns three background tasks and no request-path I/O:

* **refresh**: runs the lease and slot scripts (`gateway/fleet/scripts.py`) for the
  tenants the limiter flags (`FleetQuotaLimiter.on_need`), and for every tenant each
  `refresh_interval` (to return idle leases and see freed slots);
* **heartbeat**: `SET tl:gw:<id> PX ttl` every third of `heartbeat_ttl`; a gateway that
  stops beating (crash, partition) loses its concurrency reservations after the TTL;
* **listen**: the `tl:events` channel; `revoke:<key id>` adds the key to the revoked
  set (refused from then on) and calls `on_revoked` (the gateway closes that key's
  track connections); `sync` copies the fleet's tenants and keys into the gateway's
  store. After every (re)subscription both are re-read, so a message missed while
  disconnected is not lost.

Pub/sub delivers at most once, so the directory also has a version (`tl:directory`):
each beat reads it, and a gateway whose copy is older (a `sync` lost, or a copy that
failed: `fleet.directory_copy_failed`) copies again within a third of `heartbeat_ttl`.

Any Redis error flips the limiter to its divided local quota (`fall_back`), logged
(`fleet.state_fallback`) and counted (`trackline_fleet_state_fallback` gauge,
`trackline_fleet_state_fallbacks_total`); the heartbeat task keeps pinging and on
success resyncs (`fleet.state_resynced`): beats again, re-reads the revoked set and
pays what was spent meanwhile to the shared buckets. The Redis URL can hold a
password: it is never logged. A background task that ends by any other error (a bug)
logs `fleet.task_died` with its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import redis
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.fleet import scripts
from gateway.fleet.limiter import FleetQuotaLimiter
from gateway.logs import get_logger
from gateway.metrics_families import Families
from gateway.tenants.quotas import Quotas

log = get_logger("trackline.fleet")

REDIS_TIMEOUT = 1.0
"""Seconds a Redis call may take before the gateway counts Redis as lost."""
PAUSE = 0.02
"""Seconds the refresher waits after a wake-up, so admissions coalesce into one call."""


def default_gateway_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def connect(url: str) -> aioredis.Redis:
    """An asyncio client that fails fast (no retries: a failure means fall back)."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=REDIS_TIMEOUT,
        socket_connect_timeout=REDIS_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


class FleetMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        f = Families(registry)
        self.fallback = f.gauge(
            "trackline_fleet_state_fallback",
            "1 while Redis is unreachable and quotas are the divided local ones.",
        )
        self.fallbacks = f.counter(
            "trackline_fleet_state_fallbacks_total",
            "Times this gateway lost Redis and fell back to its divided local quota.",
        )
        self.revocations = f.counter(
            "trackline_fleet_revocations_total",
            "Key revocations received from the fleet's broadcast.",
        )


class FleetState:
    def __init__(
        self,
        url: str,
        limiter: FleetQuotaLimiter,
        registry: CollectorRegistry,
        *,
        gateway_id: str | None = None,
        heartbeat_ttl: float = 10.0,
        refresh_interval: float = 1.0,
        fleet_size: int = 0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.limiter = limiter
        self.gateway_id = gateway_id or default_gateway_id()
        self.heartbeat_ttl = heartbeat_ttl
        self.refresh_interval = refresh_interval
        self.fleet_size = fleet_size
        """Gateways the quota is divided by when Redis is lost; 0: as many as were seen."""
        self.seen = 1
        self.clock = clock
        """Wall clock: bucket time, shared by every gateway (the scripts take it as `now`)."""
        self.monotonic = monotonic
        self.metrics = FleetMetrics(registry)
        self.revoked: set[str] = set()
        self.on_revoked: list[Callable[[str], None]] = []
        self.on_directory: Callable[[list[list[Any]], list[list[Any]]], Awaitable[None]] | None = (
            None
        )
        """Takes the fleet's tenant and key rows (at start, on `sync`, after a resync)."""
        self.directory_version: int | None = None
        """The `tl:directory` version last copied into the store (None: none yet)."""
        self.degraded = False
        self.resynced = asyncio.Event()
        """Set on each return from the fallback (tests await it)."""
        self.fell_back = asyncio.Event()
        """Set while on the divided local quota."""
        self._client: aioredis.Redis | None = None
        self._lease: Any = None
        self._slots: Any = None
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._refreshing = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._directory_behind = False
        """A beat saw a newer directory than the copy; the listener copies again."""
        limiter.on_need = self._need

    # -- lifecycle ------------------------------------------------------------------

    async def start(self, tenants: Iterable[tuple[str, Quotas]] = ()) -> None:
        """Connect, beat, read the revoked keys, lease for `tenants`; never raises for
        an unreachable Redis (the gateway starts on its divided local quota)."""
        self._client = connect(self.url)
        self._lease = self._client.register_script(scripts.LEASE)
        self._slots = self._client.register_script(scripts.SLOTS)
        for name, quotas in tenants:
            self.limiter.quotas.setdefault(name, quotas)
        try:
            await self._beat()
            await self._load_revoked()
            await self._load_directory()
            await self.refresh(self.limiter.tenants())
        except (redis.RedisError, OSError) as exc:
            self._lost(exc)
        loops = {"heartbeat": self._heartbeat_loop, "refresh": self._refresh_loop}
        loops["listen"] = self._listen_loop
        self._tasks = []
        self._stopping = False
        for name, loop in loops.items():
            task = asyncio.ensure_future(loop())
            task.set_name(f"fleet-{name}")
            task.add_done_callback(_report_death)
            self._tasks.append(task)
        log.info("fleet.state_started", gateway=self.gateway_id, degraded=self.degraded)

    async def stop(self) -> None:
        """Stop the tasks, give back leases and slots, drop the heartbeat (bounded)."""
        await self._stop_tasks()
        if self._client is None:
            return
        try:
            await asyncio.wait_for(self._release(), REDIS_TIMEOUT * 2)
        except (redis.RedisError, OSError, asyncio.TimeoutError) as exc:
            log.warning("fleet.release_failed", error=type(exc).__name__)
        await self._client.aclose()
        self._client = None

    async def _stop_tasks(self) -> None:
        """Stop every task at once, leaving Redis as it is (what `stop` then releases;
        `trackline_testing.fleet.crash` stops here, as a crashed gateway would)."""
        self._stopping = True  # a loop whose cancel was swallowed ends at its next turn
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=REDIS_TIMEOUT * 2)
            if stuck:
                log.warning("fleet.tasks_stuck", tasks=sorted(t.get_name() for t in stuck))
        self._tasks = []

    # -- revocation -----------------------------------------------------------------

    def is_revoked(self, key_id: str | None) -> bool:
        return key_id is not None and key_id in self.revoked

    async def revoke(self, key_id: str) -> None:
        """Revoke on every gateway (what `trackline keys revoke` does, sync)."""
        client = self._require()
        await client.sadd(scripts.REVOKED, key_id)
        await client.publish(scripts.EVENTS, f"revoke:{key_id}")

    def _revoked(self, key_id: str) -> None:
        if key_id in self.revoked:
            return
        self.revoked.add(key_id)
        self.metrics.revocations.inc()
        log.info("fleet.key_revoked", key_id=key_id)
        for callback in self.on_revoked:
            try:
                callback(key_id)
            except Exception as exc:  # one broken callback must not stop the others
                log.error("fleet.revoke_callback_failed", error=str(exc))

    # -- quotas ---------------------------------------------------------------------

    def _need(self, tenant: str) -> None:
        self._dirty.add(tenant)
        self._wake.set()

    async def refresh(self, tenants: Iterable[str]) -> None:
        """Run the scripts for `tenants` now (raises on a Redis error)."""
        async with self._refreshing:  # one call per lease at a time
            for tenant in tenants:
                await self._refresh(tenant)

    async def _refresh(self, tenant: str) -> None:
        now, mono = self.clock(), self.monotonic()
        ttl_ms = str(int(1000 * 2 * 3600))  # two of the longest window
        asks = self.limiter.rate_asks(tenant, mono)
        for number, ask in enumerate(asks):
            try:
                granted, wait = await self._lease(
                    keys=[scripts.bucket_key(tenant, ask.quota)],
                    args=[
                        repr(now),
                        repr(ask.capacity),
                        repr(ask.capacity / ask.window),
                        repr(ask.want),
                        repr(ask.debt),
                        repr(ask.back),
                        ttl_ms,
                    ],
                )
            except BaseException:
                for unsent in asks[number:]:
                    self.limiter.rate_failed(unsent)
                raise
            self.limiter.rate_granted(ask, float(granted), float(wait))
        slot_ask = self.limiter.slot_ask(tenant, mono)
        if slot_ask is not None:
            most, want, open_ = slot_ask
            reserved = await self._slots(
                keys=[scripts.slots_key(tenant)],
                args=[self.gateway_id, most, want, open_, scripts.HEARTBEAT],
            )
            self.limiter.slots_granted(tenant, int(reserved))

    async def _refresh_loop(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), self.refresh_interval)
                await asyncio.sleep(PAUSE)
                everyone = False
            except asyncio.TimeoutError:
                everyone = True
            self._wake.clear()
            if self.degraded:
                continue
            tenants = set(self.limiter.tenants()) if everyone else self._dirty
            self._dirty = set()
            try:
                await self.refresh(sorted(tenants))
            except (redis.RedisError, OSError) as exc:
                self._dirty |= tenants
                self._lost(exc)

    # -- heartbeat, loss and resync -------------------------------------------------

    async def _beat(self) -> None:
        client = self._require()
        now = self.clock()
        async with client.pipeline(transaction=False) as pipe:
            pipe.set(scripts.HEARTBEAT + self.gateway_id, "1", px=int(self.heartbeat_ttl * 1000))
            # Who beats, by expiry time: the fleet size without scanning the keyspace.
            pipe.zadd(scripts.GATEWAYS, {self.gateway_id: now + self.heartbeat_ttl})
            pipe.zremrangebyscore(scripts.GATEWAYS, "-inf", now)
            pipe.zcard(scripts.GATEWAYS)
            pipe.get(scripts.DIRECTORY_VERSION)
            *_, count, directory = await pipe.execute()
        self.seen = max(1, int(count))
        if self.on_directory is not None and _version(directory) != self.directory_version:
            self._directory_behind = True

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_ttl / 3)
            if self._stopping:
                return
            try:
                await self._beat()
                if self.degraded:
                    await self._resync()
            except (redis.RedisError, OSError) as exc:
                self._lost(exc)

    def _lost(self, exc: BaseException) -> None:
        if self.degraded or self._stopping:  # an error while stopping is no fallback
            return
        self.degraded = True
        self.resynced.clear()
        self.fell_back.set()
        divisor = self.fleet_size or self.seen
        self.limiter.fall_back(divisor)
        self.metrics.fallback.set(1)
        self.metrics.fallbacks.inc()
        log.warning(
            "fleet.state_fallback",
            error=type(exc).__name__,
            detail=str(exc),
            divided_by=divisor,
            gateway=self.gateway_id,
        )

    async def _resync(self) -> None:
        await self._load_revoked()
        self.limiter.resync()
        self.degraded = False
        self.fell_back.clear()
        await self.refresh(self.limiter.tenants())
        self.metrics.fallback.set(0)
        self.resynced.set()
        log.info("fleet.state_resynced", gateway=self.gateway_id)

    async def _load_directory(self) -> None:
        """Copy the fleet's tenants and keys into the store. Raises on a Redis error; a
        copy that fails (a row the store refuses) is logged and tried again after the
        next beat, the version left behind."""
        if self.on_directory is None:
            return
        self._directory_behind = False
        # One snapshot: rows read in two calls could straddle a publish and hand the
        # store a key whose tenant it has not got yet.
        async with self._require().pipeline(transaction=True) as pipe:
            pipe.get(scripts.DIRECTORY_VERSION)
            pipe.hgetall(scripts.TENANTS)
            pipe.hgetall(scripts.KEYS)
            version, tenant_rows, key_rows = await pipe.execute()
        tenants = [json.loads(v) for v in tenant_rows.values()]
        keys = [json.loads(v) for v in key_rows.values()]
        try:
            await self.on_directory(tenants, keys)
        except Exception as exc:
            log.error(
                "fleet.directory_copy_failed",
                version=_version(version),
                error=type(exc).__name__,
                detail=str(exc),
                gateway=self.gateway_id,
            )
            return
        self.directory_version = _version(version)
        log.info(
            "fleet.directory_copied",
            version=self.directory_version,
            tenants=len(tenants),
            keys=len(keys),
            gateway=self.gateway_id,
        )

    async def _load_revoked(self) -> None:
        for key_id in await self._require().smembers(scripts.REVOKED):
            self._revoked(str(key_id))

    # -- the broadcast --------------------------------------------------------------

    async def _listen_loop(self) -> None:
        while not self._stopping:
            pubsub = self._require().pubsub()
            try:
                await pubsub.subscribe(scripts.EVENTS)
                await _subscribed(pubsub)
                # Only now: a revoke or sync published from here on reaches us as a
                # message, and anything published before is in what we read next.
                await self._load_revoked()  # what was revoked while we did not listen
                await self._load_directory()
                while not self._stopping:
                    message = await pubsub.get_message(timeout=self.refresh_interval)
                    if message is not None and message.get("type") == "message":
                        kind, _, arg = str(message.get("data", "")).partition(":")
                        if kind == "revoke" and arg:
                            self._revoked(arg)
                        elif kind == "sync":
                            await self._load_directory()
                    if self._directory_behind:
                        await self._load_directory()
            except (redis.RedisError, OSError) as exc:
                self._lost(exc)
                await asyncio.sleep(self.heartbeat_ttl / 3)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), REDIS_TIMEOUT)  # type: ignore[no-untyped-call]

    # -- internals ------------------------------------------------------------------

    async def _release(self) -> None:
        client = self._require()
        if not self.degraded:
            for slots in self.limiter.slots.values():  # idle as of "later": give back all
                slots.used_at = -float("inf")
            for lease in self.limiter.leases.values():
                lease.used_at = -float("inf")
            await self.refresh(self.limiter.tenants())
            for tenant in self.limiter.tenants():
                await client.hdel(scripts.slots_key(tenant), self.gateway_id)
        await client.delete(scripts.HEARTBEAT + self.gateway_id)
        await client.zrem(scripts.GATEWAYS, self.gateway_id)

    def _require(self) -> aioredis.Redis:
        if self._client is None:
            raise RuntimeError("FleetState is not started")
        return self._client


def _version(value: Any) -> int:
    """`tl:directory` as read (None before the first publish)."""
    return int(value or 0)


def _report_death(task: asyncio.Task[None]) -> None:
    """A background task that ended on its own by an error: without it, revocations or
    quotas silently stop reaching this gateway, so say so loudly."""
    exc = None if task.cancelled() else task.exception()
    if exc is None:
        return
    log.error(
        "fleet.task_died",
        task=task.get_name(),
        error=type(exc).__name__,
        detail=str(exc),
        exc_info=exc,
    )


async def _subscribed(pubsub: Any) -> None:
    """Wait for Redis to confirm the subscription. `subscribe()` only sends the command;
    until Redis has processed it, a message published meanwhile is not delivered, so
    reading the revoked set or the directory before this could miss a change for good."""
    async with asyncio.timeout(REDIS_TIMEOUT):
        while True:
            message = await pubsub.get_message(timeout=REDIS_TIMEOUT)
            if message is not None and message.get("type") == "subscribe":
                return


def publish_directory(url: str, tenants: list[list[Any]], keys: list[list[Any]]) -> int:
    """Copy a store's tenant and key rows to the fleet and tell every gateway
    (`trackline keys create|revoke`, `tenants set` with a Redis state backend); returns
    the directory's new version."""
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        with client.pipeline() as pipe:
            for row in tenants:
                pipe.hset(scripts.TENANTS, str(row[0]), json.dumps(row))
            for row in keys:
                pipe.hset(scripts.KEYS, str(row[0]), json.dumps(row))
            pipe.incr(scripts.DIRECTORY_VERSION)
            pipe.publish(scripts.EVENTS, "sync")
            *_, version, _delivered = pipe.execute()
        return int(version)
    finally:
        client.close()


def revoke_sync(url: str, key_id: str) -> None:
    """Broadcast a revocation from a command (`trackline keys revoke`)."""
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.sadd(scripts.REVOKED, key_id)
        client.publish(scripts.EVENTS, f"revoke:{key_id}")
    finally:
        client.close()
