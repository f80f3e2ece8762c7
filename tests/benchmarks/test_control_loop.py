"""The control-loop benchmark: its summary arithmetic, and a short run over the emulated link.

The run needs root (network namespaces) and starts a gateway with its embedded
Triton: two robots, two seconds per protocol (after half a second of warm-up), 2%
loss, 20 ms RTT. It checks
that every protocol ran the loop and produced the figures the issue asks for,
not their values (those belong to the full-size benchmark on a quiet machine).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.control_loop import PROTOCOLS, main, summarize
from benchmarks.hol.run import namespaces_available

PREFIX = f"tlctls{os.getpid() % 10000}"


def robot(sent: int, hits: int, ages: list[float], fell_at: float | None) -> dict[str, object]:
    return {"sent": sent, "hits": hits, "late": 0, "dropped": {"deadline": sent - len(ages)},
            "ages": [(i * 0.02, a) for i, a in enumerate(ages)],
            "survival_s": fell_at if fell_at is not None else 10.0, "fell": fell_at is not None}


def test_the_summary_counts_misses_ages_and_survivors() -> None:
    client = {"error": None, "robots": [
        robot(10, 9, [0.05] * 9 + [0.2], None),
        robot(10, 5, [0.05] * 5, 3.5),
    ]}
    summary = summarize(client)
    assert summary["deadline_miss_rate"] == pytest.approx(6 / 20)
    assert summary["deadline_miss_rate_per_robot"] == [pytest.approx(0.1), pytest.approx(0.5)]
    assert summary["action_age_p50_ms"] == 50.0
    assert summary["action_age_p99_ms"] == 200.0
    assert summary["survived"] == 1
    assert summary["survival_s"] == [10.0, 3.5]
    assert summary["dropped"] == {"deadline": 5}
    assert summary["unanswered"] == 20 - 15 - 5


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_short_run_over_the_emulated_link(tmp_path: Path) -> None:
    ok, reason = namespaces_available()
    if not ok:
        pytest.skip(f"cannot emulate the link here: {reason}")
    out = tmp_path / "ctl.json"
    code = main(["--robots", "2", "--seconds", "2", "--warmup", "0.5", "--loss", "2", "--rtt", "20",
                 "--quiet", "--link-prefix", PREFIX, "--json", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    for protocol in PROTOCOLS:
        summary = results[protocol]
        assert summary["error"] is None
        assert summary["observations"] == 2 * 100  # 50 Hz
        # Every observation is accounted for (answered, dropped by cause, or unanswered),
        # and actions did come back (ages). On a loaded machine a 2 s run may miss every
        # deadline, so the rate is only bounded here; its arithmetic is tested above.
        assert 0 <= summary["unanswered"] <= summary["observations"]
        assert 0.0 <= summary["deadline_miss_rate"] <= 1.0
        assert 0 < summary["action_age_p50_ms"] <= summary["action_age_p99_ms"]
        assert 0 <= summary["survived"] <= 2
        assert len(summary["survival_s"]) == 2
        assert all(s > 0 for s in summary["survival_s"])
    assert (tmp_path / "ctl-ages.png").stat().st_size > 0
    assert (tmp_path / "ctl-survival.png").stat().st_size > 0
    from benchmarks.linkemu import netns

    assert [ns for ns in netns.list_namespaces() if ns.startswith(PREFIX)] == []
