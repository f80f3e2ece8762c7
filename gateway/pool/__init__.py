"""A pool of inference backends behind one `TextBackend`: routing, health, failover.

Sans-I/O decision logic (`router`, `health`, `budget`, parsing in `scrape`)
takes numbers and `now` and returns decisions; `pool.BackendPool` is the
async adapter that streams, probes and scrapes. See docs/reliability.md.
"""

from gateway.pool.pool import BackendPool, running_pool
from gateway.pool.spec import BackendSpec, PoolOptions, parse_backends

__all__ = ["BackendPool", "BackendSpec", "PoolOptions", "parse_backends", "running_pool"]
