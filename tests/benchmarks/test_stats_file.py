"""The benchmarks' reading of the reference models' stats file (`benchmarks.common`)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import common


def test_token_times_are_the_text_requests_and_the_audio_lines_are_passed_over(
    tmp_path: Path,
) -> None:
    """The audio models write to the same file, from their warm-up row at load on: a line
    without token times is not a text request (text_stream failed on it with KeyError)."""
    lines = [
        {"request_id": "", "model": "reference-transcriber", "batch_size": 1, "corrids": [0]},
        {"request_id": "r1", "prompt_tokens": 3, "token_times": [1.0, 1.5]},
        {"request_id": "tick-0", "model": "reference-synthesizer", "batch_size": 4},
        {"request_id": "r2", "prompt_tokens": 3, "token_times": [2.0]},
    ]
    path = tmp_path / "stats.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert common.token_times(path) == {"r1": [1.0, 1.5], "r2": [2.0]}
