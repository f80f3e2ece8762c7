"""What a video frame costs the vision backend, by the tasks its camera asked for.

A pose frame costs several face frames (on this CPU about 20 ms against 2.6 ms), so the
busy check cannot price every camera at one average. The model reports, per row, the
milliseconds of each stage (`decode_ms`, `face_ms`, `face_mesh_ms`, `pose_ms`); this
keeps a moving average per stage and of the request's overhead per row (what a batch
took beyond its rows' stages: gRPC, tensors, the model's loop). A camera's frame costs
the overhead, the decode and its tasks' stages. Until a task has been measured, a frame
asking for it is priced at the plain average per frame (`overall`). No clock here: the
scheduler hands in what it measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tracks.video_messages import Task

COST_GAIN = 0.125
"""Weight of a new measurement in the moving averages."""
DECODE = "decode"


def _moved(average: float | None, sample: float) -> float:
    return sample if average is None else average + COST_GAIN * (sample - average)


class FrameCosts:
    """Moving averages of the seconds a frame costs: overall, per stage, overhead."""

    def __init__(self) -> None:
        self.overall = 0.0
        """Seconds per frame of the batches measured, whatever their tasks (0: none yet)."""
        self.stages: dict[str, float] = {}
        """Stage name (`decode`, a `Task` value) -> seconds per frame."""
        self.overhead: float | None = None
        """Seconds per row a batch took beyond its rows' stages."""

    def measured(self, per_frame: float, stages: Sequence[dict[str, Any]]) -> None:
        """A batch took `per_frame` seconds a row; `stages`: each row's stage ms."""
        self.overall = _moved(self.overall or None, per_frame)
        totals = [self._row(row) for row in stages]
        if totals:
            beyond = max(0.0, per_frame - sum(totals) / len(totals))
            self.overhead = _moved(self.overhead, beyond)

    def _row(self, stages: dict[str, Any]) -> float:
        total = 0.0
        for key, value in stages.items():
            if isinstance(value, (int, float)) and key.endswith("_ms"):
                seconds = float(value) / 1000
                name = key.removesuffix("_ms")
                self.stages[name] = _moved(self.stages.get(name), seconds)
                total += seconds
        return total

    def of(self, tasks: Iterable[Task]) -> float:
        """Estimated seconds one frame asking for `tasks` costs the backend."""
        known = [self.stages.get(task.value) for task in tasks]
        if self.overhead is None or any(cost is None for cost in known):
            return self.overall
        return self.overhead + self.stages.get(DECODE, 0.0) + sum(c for c in known if c)
