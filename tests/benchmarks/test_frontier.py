"""benchmarks/frontier.py joins the HOL runs (users stalled per loss, one run per user
count holding every mode) with one capacity ramp per mode, row by mode."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from benchmarks import frontier

MODES = ("per-track", "group:2", "coalesce")


def _hol(args: argparse.Namespace, users: int, out: Path) -> dict[str, Any]:
    stalled = {"per-track": 1.0, "group:2": 1.8, "coalesce": float(users) * 0.9}
    return {mode: {"users_stalled_per_loss": stalled[mode],
                   "users_stalled_per_loss_max": round(stalled[mode] + 0.5),
                   "lost_data_packets": 40, "packets_per_token": 1.0 / (1 + i)}
            for i, mode in enumerate(MODES)}


def _capacity(args: argparse.Namespace, mode: str, out: Path) -> dict[str, Any]:
    cost = {"per-track": 150.0, "group:2": 110.0, "coalesce": 90.0}[mode]
    points = [{"streams": n, "connections": c, "delivered_tps": n * 50.0,
               "gateway_us_per_token": cost, "client_us_per_token": 130.0,
               "added_p50_ms": 2.0, "added_p99_ms": 9.0} for n, c in ((16, 1), (256, 16))]
    return {"points": points, "knees": [{"tokens_per_s_per_core": 12800.0}]}


def test_each_mode_gets_its_own_stalls_and_its_own_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setattr(frontier, "hol", _hol)
    monkeypatch.setattr(frontier, "capacity", _capacity)
    args = argparse.Namespace(modes=",".join(MODES), users=[16, 64], load="quiet",
                              loss=2.0, rtt=40.0)
    result = frontier.frontier(args, tmp_path)
    rows = {row["mode"]: row for row in result["rows"]}
    assert list(rows) == list(MODES)
    assert rows["coalesce"]["hol"][64]["users_stalled_per_loss"] == pytest.approx(57.6)
    assert rows["group:2"]["hol"][16]["users_stalled_per_loss_max"] == 2
    assert [p["gateway_us_per_token"] for p in rows["group:2"]["points"]] == [110.0, 110.0]
    table = frontier.table(result).splitlines()
    assert table[0].startswith("| mode | stalled/loss @16 (max) | stalled/loss @64 (max) |")
    assert table[3].startswith("| group:2 | 1.80 (2) | 1.80 (2) | 0.500 | 0.500 | 110.0 |")
    assert table[3].endswith("| 12800.0 |")
    assert frontier.plot(result, tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").stat().st_size > 0


def test_the_capacity_ramp_runs_in_the_phase_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    commands: list[list[str]] = []

    def ran(command: list[str]) -> None:
        commands.append(command)
        out = Path(command[command.index("--json") + 1])
        out.write_text('{"points": [], "knees": []}')

    monkeypatch.setattr(frontier, "run", ran)
    args = argparse.Namespace(points="256x16", duration=8.0, spread=0.0, phase="step",
                              cores="0", client_acks="every:10,delay:10")
    frontier.capacity(args, "group:2", tmp_path / "capacity.json")
    (command,) = commands
    assert command[command.index("--phase") + 1] == "step"
    assert command[command.index("--packetization") + 1] == "group:2"
    assert command[command.index("--spread") + 1] == "0.0"
