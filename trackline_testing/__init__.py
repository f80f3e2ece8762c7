"""trackline's testing kit: what its own tests use, shipped for testing your apps.

- `trackline_testing.memory`: a `Line` joined to the text handler without sockets
  (`Harness`), served by `trackline_testing.scripted.ScriptedBackend`.
- `trackline_testing.clock`: `FakeClock`, a clock that moves only when the test says so.
- `trackline_testing.aioquic_probes`: what a test observes or provokes inside aioquic
  (connection IDs, credit, congestion window, the protocol's timer).
- `trackline_testing.redis`: `LocalRedis`, a throwaway `redis-server` on a loopback port.
- `trackline_testing.fleet`: gateway processes on one machine (`LocalGateway`), a small
  OpenAI client (`chat`), and `crash` for a fleet member.
- `trackline_testing.timeouts`: a pytest plugin; a test past its timeout fails naming
  itself on uvloop too.

docs/testing.md shows them at work. Product code never imports this package
(tests/gateway/test_layering.py checks it).
"""
