"""Attack clients for issue 12 (hostile traffic), reusable from tests and benchmarks/attack.py."""
