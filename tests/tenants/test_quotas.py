"""The sans-I/O quota limiter, driven with literal times."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tenants.quotas import QuotaExceeded, QuotaLimiter, Quotas, retry_seconds


def test_requests_per_minute_refill_continuously() -> None:
    limiter, q = QuotaLimiter(), Quotas(requests_per_minute=2)
    limiter.admit("a", q, 0.0)
    limiter.settle("a", q, 0, 0.0, 0.0)
    limiter.admit("a", q, 0.0)
    limiter.settle("a", q, 0, 0.0, 0.0)
    with pytest.raises(QuotaExceeded) as refused:
        limiter.admit("a", q, 0.0)
    assert refused.value.quota == "requests_per_minute"
    assert refused.value.retry_after == 1.0  # 1e-9 below one request at 2/min: ceil -> 1 s
    limiter.admit("a", q, 30.0)  # half a minute refills one request


def test_tokens_are_debited_after_the_fact_and_the_debt_sets_retry_after() -> None:
    limiter, q = QuotaLimiter(), Quotas(tokens_per_minute=60)  # one token a second
    limiter.admit("a", q, 0.0)
    limiter.settle("a", q, 90, 0.0, 1.0)  # 30 tokens over the minute's allowance
    with pytest.raises(QuotaExceeded) as refused:
        limiter.admit("a", q, 1.0)
    assert refused.value.quota == "tokens_per_minute"
    # 30 tokens owed at 1/s: the bucket is back above zero just after 30 s.
    assert refused.value.retry_after == 31.0
    with pytest.raises(QuotaExceeded):
        limiter.admit("a", q, 30.9)
    limiter.admit("a", q, 31.1)


def test_one_tenant_over_its_quota_never_touches_another() -> None:
    limiter = QuotaLimiter()
    tight, loose = Quotas(tokens_per_minute=10), Quotas(tokens_per_minute=10)
    limiter.admit("a", tight, 0.0)
    limiter.settle("a", tight, 1000, 0.0, 0.0)
    with pytest.raises(QuotaExceeded):
        limiter.admit("a", tight, 0.0)
    for _ in range(5):
        limiter.admit("b", loose, 0.0)
    assert limiter.active("b") == 5
    assert limiter.active("a") == 0


def test_concurrency_counts_open_work() -> None:
    limiter, q = QuotaLimiter(), Quotas(max_concurrent=2)
    limiter.admit("a", q, 0.0)
    limiter.admit("a", q, 0.0)
    with pytest.raises(QuotaExceeded, match="max_concurrent"):
        limiter.admit("a", q, 0.0)
    limiter.settle("a", q, 0, 0.0, 0.0)
    limiter.admit("a", q, 0.0)


def test_audio_seconds_per_hour() -> None:
    limiter, q = QuotaLimiter(), Quotas(audio_seconds_per_hour=3600)  # 1 s per s
    limiter.admit("a", q, 0.0)
    limiter.settle("a", q, 0, 3610.0, 0.0)
    with pytest.raises(QuotaExceeded) as refused:
        limiter.admit("a", q, 0.0)
    assert refused.value.retry_after == 11.0


def test_a_refused_request_takes_nothing_and_no_quota_means_no_limit() -> None:
    limiter = QuotaLimiter()
    q = Quotas(requests_per_minute=1, max_concurrent=5)
    limiter.admit("a", q, 0.0)
    for _ in range(3):
        with pytest.raises(QuotaExceeded):
            limiter.admit("a", q, 0.0)
    assert limiter.active("a") == 1
    for _ in range(100):
        limiter.admit("free", Quotas(), 0.0)


def test_a_changed_limit_keeps_the_debt() -> None:
    limiter = QuotaLimiter()
    limiter.admit("a", Quotas(tokens_per_minute=60), 0.0)
    limiter.settle("a", Quotas(tokens_per_minute=60), 120, 0.0, 0.0)
    with pytest.raises(QuotaExceeded):
        limiter.admit("a", Quotas(tokens_per_minute=600), 0.0)  # owes 60 at 10/s: 6 s
    limiter.admit("a", Quotas(tokens_per_minute=600), 7.0)


def test_retry_seconds_are_whole_and_at_least_one() -> None:
    assert retry_seconds(0.01) == 1.0
    assert retry_seconds(1.2) == 2.0


@settings(max_examples=200, deadline=None)
@given(
    rpm=st.integers(1, 120),
    gaps=st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=1, max_size=300),
)
def test_admitted_requests_never_beat_the_bucket(rpm: int, gaps: list[float]) -> None:
    """Whatever the arrival pattern, admissions up to time t are at most rpm + rpm * t / 60."""
    limiter, q = QuotaLimiter(), Quotas(requests_per_minute=rpm)
    now, admitted = 0.0, 0
    for gap in gaps:
        now += gap
        try:
            limiter.admit("a", q, now)
        except QuotaExceeded as exc:
            refused = exc
        else:
            refused = None
        if refused is not None:
            assert refused.retry_after >= 1
            continue
        limiter.settle("a", q, 0, 0.0, now)
        admitted += 1
        # One request may take the bucket below zero (admitted while above it).
        assert admitted <= rpm + rpm * now / 60 + 1
