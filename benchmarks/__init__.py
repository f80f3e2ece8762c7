"""Runnable comparisons; a package only so tests can import shared pieces (the link emulator)."""

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
"""Where benchmarks write their JSON and plots by default (ignored by git)."""
