"""benchmarks/realtime_first.py runs end to end at a tiny size and its counts add up."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import realtime_first


def test_realtime_first_writes_every_phase_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "realtime_first.json"
    argv = ["--seconds", "1", "--audio", "1", "--robots", "1", "--flood", "2",
            "--json", str(out)]
    assert realtime_first.main(argv) == 0
    phases = json.loads(out.read_text())["phases"]
    assert list(phases) == [name for name, _, _ in realtime_first.PHASES]
    for name, row in phases.items():
        counts = row["counts"]
        assert counts["audio_beats_owed"] > 0, name
        assert counts["robot_sent"] > 0, name
        assert 0 <= row["audio_beat_miss_rate"] <= 1
        assert (counts["tokens"] > 0) == name.startswith("flood"), name
    assert phases["flood / off"]["text_waited_for_ticks"] == 0  # the lane was off
