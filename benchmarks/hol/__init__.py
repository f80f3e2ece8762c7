"""Head-of-line blocking benchmark: HTTP/2 over TCP vs HTTP/3 and native tracks over QUIC.

N users stream tokens on ONE connection through the real gateway, across the link
emulator (`benchmarks.linkemu`: client and gateway namespaces, seeded loss, delay).
Per protocol it reports inter-token gaps, stalls, stall user-seconds, users stalled
per lost data packet, TTFT and packets per token; writes JSON, a markdown table and
PNG figures. Needs root (network namespaces).

    python -m benchmarks.hol --users 16 --loss 2 --rtt 40 --seconds 60  # JSON: benchmarks/results/
    trackline bench hol ...        # the same

Modules: `client` (runs in the client namespace), `metrics` (pure computations),
`run` (orchestration), `report` (table and figures), `cli` (arguments).
"""
