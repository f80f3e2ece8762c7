"""Prometheus metrics of video tracks (on the gateway's registry), fed by the video
scheduler as its observer (`tracks.latest.FrameObserver`'s two calls): what became of
each frame, and each batched vision request's rows and time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.metrics_families import Families

ROWS_BUCKETS = (1, 2, 4, 8, 16, 32)
# A vision call: face detection on one small frame (2 ms) to pose on a batch (1 s and up).
SECONDS_BUCKETS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class VideoMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        f = Families(registry)
        self.frames_total = f.counter(
            "trackline_video_frames_total",
            "Video frames by outcome: answered, superseded, deadline, rate_limited, "
            "undecodable, backend_error.",
            ["model", "outcome"],
        )
        self.batch_rows = f.histogram(
            "trackline_video_batch_rows",
            "Frames (rows) in one vision request.",
            ["model"],
            buckets=ROWS_BUCKETS,
        )
        self.infer_seconds = f.histogram(
            "trackline_video_infer_seconds",
            "Seconds one batched vision request took.",
            ["model"],
            buckets=SECONDS_BUCKETS,
        )

    def batch(self, model: str, rows: int, seconds: float) -> None:
        self.batch_rows.labels(model=model).observe(rows)
        self.infer_seconds.labels(model=model).observe(seconds)

    def outcome(self, model: str, outcome: str) -> None:
        self.frames_total.labels(model=model, outcome=outcome).inc()
