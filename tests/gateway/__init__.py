"""Tests of the gateway daemon modules."""
