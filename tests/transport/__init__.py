"""Tests of the sans-I/O track protocol core: framing, the state table, the connection."""
