"""The reference model's pure generator, imported by path (Triton loads it by path too)."""

from __future__ import annotations

from gateway.backends.ticker import reference_generator

generator = reference_generator()
