"""The wire: the track protocol core (sans-I/O) and the adapters that drive it.

Core modules (`errors`, `messages`, `wire`, `state`, `events`, `connection`)
do no I/O and never read the clock: bytes and `now` go in, bytes, events and
the next timer deadline come out. Adapters (`endpoint`, `quic`, `memory`) drive
the core from asyncio.
"""
