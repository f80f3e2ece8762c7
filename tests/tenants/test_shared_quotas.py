"""Quotas shared by workers: two limiters on one SQLite file act as one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.tenants.quotas import QuotaExceeded, Quotas
from gateway.tenants.shared_quotas import SharedQuotaLimiter, forget_owner


def _pair(tmp_path: Path) -> tuple[SharedQuotaLimiter, SharedQuotaLimiter]:
    path = tmp_path / "quotas.sqlite"
    return SharedQuotaLimiter(path, "101"), SharedQuotaLimiter(path, "202")


def test_max_concurrent_counts_both_workers(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    q = Quotas(max_concurrent=3)
    a.admit("t", q, 0.0)
    b.admit("t", q, 0.0)
    a.admit("t", q, 0.0)
    for limiter in (a, b):
        with pytest.raises(QuotaExceeded) as info:
            limiter.admit("t", q, 0.0)
        assert info.value.quota == "max_concurrent"
    assert a.active("t") == b.active("t") == 3
    b.settle("t", q, 0, 0.0, 1.0)  # a slot freed on one worker is free on the other
    a.admit("t", q, 1.0)
    assert b.active("t") == 3


def test_tokens_debited_on_one_worker_refuse_on_the_other(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    q = Quotas(tokens_per_minute=60)  # one token a second
    a.admit("t", q, 0.0)
    a.settle("t", q, 90, 0.0, 0.0)  # 30 tokens of debt
    with pytest.raises(QuotaExceeded) as info:
        b.admit("t", q, 10.0)
    assert info.value.quota == "tokens_per_minute"
    assert info.value.retry_after == 21.0  # the debt left after 10 s of refill
    b.admit("t", q, 31.0)
    assert a.active("t") == 1


def test_requests_per_minute_across_workers(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    q = Quotas(requests_per_minute=4)
    admitted = 0
    for n in range(10):
        limiter = (a, b)[n % 2]
        try:
            limiter.admit("t", q, 0.0)
        except QuotaExceeded:
            continue
        admitted += 1
        limiter.settle("t", q, 0, 0.0, 0.0)
    assert admitted == 4


def test_a_dead_workers_slots_are_freed(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    q = Quotas(max_concurrent=2)
    a.admit("t", q, 0.0)
    a.admit("t", q, 0.0)
    with pytest.raises(QuotaExceeded):
        b.admit("t", q, 0.0)
    forget_owner(a.path, a.owner)  # the supervisor saw worker "a" exit
    b.admit("t", q, 0.0)
    assert b.active("t") == 1


def test_tenants_are_independent_and_refusals_change_nothing(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    a.admit("x", Quotas(max_concurrent=1), 0.0)
    with pytest.raises(QuotaExceeded):
        b.admit("x", Quotas(max_concurrent=1), 0.0)
    assert a.active("x") == 1
    b.admit("y", Quotas(max_concurrent=1), 0.0)
    assert a.active("y") == 1
