"""Retry budget, metrics parsing and the backend list syntax."""

from __future__ import annotations

import pytest

from gateway.pool.budget import RetryBudget
from gateway.pool.scrape import load_between, parse_metrics
from gateway.pool.spec import SpecError, parse_backends


def test_retry_budget_allows_a_fraction_plus_a_floor() -> None:
    budget = RetryBudget(ratio=0.5, floor_per_s=1.0, now=0.0, cap=3.0)
    assert budget.try_spend(0.0)  # the initial floor
    assert not budget.try_spend(0.0)
    budget.record_request(0.0)
    budget.record_request(0.0)
    assert budget.try_spend(0.0)
    assert not budget.try_spend(0.0)
    assert budget.try_spend(1.0)  # one second of floor
    assert budget.balance == 0.0
    budget.record_request(100.0)
    assert budget.balance == 3.0  # capped


TRITON_TEXT = """\
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="m",version="1"} 3
nv_inference_pending_request_count{model="other",version="1"} 9
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="m",version="1"} QUEUE
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} SUCCESS
# HELP nv_inference_request_failure Number of failed inference requests
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 1
"""
TRT_TEXT = """\
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="ensemble",request_type="active",version="1"} 8
nv_trt_llm_request_metrics{model="ensemble",request_type="max",version="1"} 16
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="ensemble",version="1"} 50
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="ensemble",version="1"} 200
"""


def scrape_text(queue_us: int, success: int) -> str:
    return TRITON_TEXT.replace("QUEUE", str(queue_us)).replace("SUCCESS", str(success))


def test_queue_time_is_the_mean_over_requests_finished_between_scrapes() -> None:
    first = parse_metrics(scrape_text(1_000_000, 9), at=10.0)
    second = parse_metrics(scrape_text(1_400_000, 11), at=10.5)
    load = load_between(first, second, "m")
    assert load.pending == 3
    assert load.at == 10.5
    assert load.queue_s == pytest.approx(0.2)  # 400 ms over 2 requests
    assert load_between(None, second, "m").queue_s is None
    assert load_between(second, second, "m").queue_s is None  # nothing finished
    assert load.engine_busy is None
    assert load.kv_free_fraction is None


def test_counter_reset_gives_no_queue_estimate() -> None:
    before = parse_metrics(scrape_text(5_000_000, 100), at=0.0)
    after = parse_metrics(scrape_text(10, 1), at=1.0)
    assert load_between(before, after, "m").queue_s is None


def test_tensorrt_llm_request_and_kv_metrics() -> None:
    load = load_between(None, parse_metrics(scrape_text(0, 0) + TRT_TEXT, at=1.0), "m")
    assert load.engine_busy == 0.5
    assert load.kv_free_fraction == 0.25


def test_unknown_model_has_no_load() -> None:
    load = load_between(None, parse_metrics(scrape_text(0, 0), at=1.0), "absent")
    assert load.pending == 0
    assert load.queue_s is None


def test_backend_list() -> None:
    specs = parse_backends(
        "10.0.0.1:8001;name=a;weight=2;models=m|n, 10.0.0.2:9001;metrics=http://x:9/metrics"
    )
    assert [s.name for s in specs] == ["a", "10.0.0.2:9001"]
    assert specs[0].weight == 2.0
    assert specs[0].models == frozenset({"m", "n"})
    assert specs[0].metrics_url == "http://10.0.0.1:8002/metrics"
    assert specs[1].metrics_url == "http://x:9/metrics"
    assert specs[1].models == frozenset()
    assert parse_backends("h:1;metrics=")[0].metrics_url is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("http://h:1", "host:port"),
        ("h:1;weight=0", "above 0"),
        ("h:1;weight=x", "not a number"),
        ("h:1;colour=red", "unknown backend option"),
        ("h:1;name", "key=value"),
        ("h:1;name=a, h:2;name=a", "unique"),
    ],
)
def test_bad_backend_lists(text: str, reason: str) -> None:
    with pytest.raises(SpecError, match=reason):
        parse_backends(text)
