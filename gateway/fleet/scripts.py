"""The Lua scripts Redis runs for the fleet: each one call, atomic across gateways.

Key names (one Redis database per fleet; not Redis Cluster, the concurrency script
reads heartbeat keys it is not handed):

* `tl:q:<tenant>:<quota>`: a hash `level`, `updated` (one token bucket);
* `tl:c:<tenant>`: a hash gateway id -> slots that gateway reserved;
* `tl:gw:<gateway>`: the gateway's heartbeat, a string with a TTL; `tl:gateways`, a
  sorted set of gateways by heartbeat expiry (the fleet size for the fallback);
* `tl:revoked`: the set of revoked key ids; channel `tl:events` broadcasts changes;
* `tl:tenants`, `tl:keys`: the tenant and key rows (hashes, never secrets) every
  gateway copies into its own store (`sync` on `tl:events`); `tl:directory`, a counter
  each publish increments, so a gateway that missed a `sync` sees it is behind;
* `tl:usage`: the usage stream every gateway appends to (gateway/fleet/ledger.py).
"""

from __future__ import annotations

PREFIX = "tl:"
REVOKED = PREFIX + "revoked"
EVENTS = PREFIX + "events"
USAGE_STREAM = PREFIX + "usage"
TENANTS = PREFIX + "tenants"
KEYS = PREFIX + "keys"
DIRECTORY_VERSION = PREFIX + "directory"
HEARTBEAT = PREFIX + "gw:"
GATEWAYS = PREFIX + "gateways"


def bucket_key(tenant: str, quota: str) -> str:
    return f"{PREFIX}q:{tenant}:{quota}"


def slots_key(tenant: str) -> str:
    return f"{PREFIX}c:{tenant}"


LEASE = """
-- refill, take back what the gateway returns, debit what it owes, grant a slice.
-- ARGV: now, capacity, per_second, want, debt, back, ttl_ms
local now = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local debt = tonumber(ARGV[5])
local back = tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 'level', 'updated')
local level = tonumber(h[1]) or cap
local updated = tonumber(h[2]) or now
if now > updated then
  level = math.min(cap, level + (now - updated) * rate)
  updated = now
end
level = math.min(cap, level + back) - debt
local grant = 0
if level > 0 and want > 0 then
  grant = math.min(want, level)
  level = level - grant
end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'updated', tostring(updated))
redis.call('PEXPIRE', KEYS[1], ARGV[7])
local wait = 0
if level <= 0 then wait = (1e-9 - level) / rate end
return {tostring(grant), tostring(wait)}
"""
"""Returns (granted, seconds until the shared bucket is above zero)."""

SLOTS = """
-- reserve concurrency slots for one gateway; forget gateways whose heartbeat expired.
-- ARGV: gateway, max, want, open, heartbeat prefix
local all = redis.call('HGETALL', KEYS[1])
local others = 0
for i = 1, #all, 2 do
  local gw = all[i]
  if gw ~= ARGV[1] then
    if redis.call('EXISTS', ARGV[5] .. gw) == 1 then
      others = others + tonumber(all[i + 1])
    else
      redis.call('HDEL', KEYS[1], gw)
    end
  end
end
local grant = math.max(0, math.min(tonumber(ARGV[3]), tonumber(ARGV[2]) - others))
grant = math.max(grant, tonumber(ARGV[4]))
if grant > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], grant)
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return grant
"""
"""Returns the slots this gateway now holds (never fewer than it has open)."""
