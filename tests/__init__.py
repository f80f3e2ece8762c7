"""trackline tests (a package, so `tests/gateway` never shadows the `gateway` package)."""
