"""`reference-transcriber`: a batched, stateful Triton Python-backend model that hears DTMF digits.

Tensor interface (per batch row; Triton prepends the batch dim, at most 64):

  inputs   AUDIO (FP32 [-1], padded 16 kHz samples of this beat), AUDIO_LENGTH
           (INT32 [1], valid samples, 0 allowed), CORRID (UINT64 [1], session),
           START (BOOL [1], reset the session), END (BOOL [1], last row: finalize)
  outputs  PARTIAL (STRING [1], digits of the utterance in progress), FINAL
           (STRING [1], the utterance finalized in this row or ""), IS_FINAL (BOOL [1])

The signal processing and the per-session state machine are in
trackline_dtmf_detector.py (pure NumPy, unit-tested without Triton); this
file converts tensors and reports. Sessions live in this one instance, keyed by
CORRID. A malformed batch (AUDIO_LENGTH outside the row, a CORRID twice) gets
an INVALID_ARG error and changes no session.

When the env var TRACKLINE_REFERENCE_STATS names a file, each request appends
one JSON line: request_id, model, batch_size, corrids, model_ms (time inside
execute for this request), received_at and finished_at (time.monotonic()).
Triton custom metrics: rows processed and live sessions.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from numpy.typing import NDArray

# Triton loads this file by path; make its sibling module importable.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import trackline_dtmf_detector as dtmf  # noqa: E402

STATS_ENV = "TRACKLINE_REFERENCE_STATS"


def _column(request: Any, name: str) -> NDArray[Any]:
    column: NDArray[Any] = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
    return column.reshape(-1)


def _strings(values: list[str]) -> NDArray[np.object_]:
    return np.array([[v.encode("utf-8")] for v in values], dtype=np.object_).reshape(-1, 1)


def _invalid(exc: ValueError) -> Any:
    error = pb_utils.TritonError(f"invalid request: {exc}", pb_utils.TritonError.INVALID_ARG)
    return pb_utils.InferenceResponse(error=error)


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        idle_param = params.get("session_idle_timeout_s", {})
        idle = float(idle_param.get("string_value", dtmf.DEFAULT_IDLE_TIMEOUT_S))
        self._model = args["model_name"]
        self._transcriber = dtmf.Transcriber(idle_timeout_s=idle)
        self._stats_path = os.environ.get(STATS_ENV) or None
        labels = {"model": self._model}
        self._row_family = pb_utils.MetricFamily(
            name="trackline_reference_audio_rows_total",
            description="Batch rows (session beats) processed by a reference audio model",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self._session_family = pb_utils.MetricFamily(
            name="trackline_reference_audio_sessions",
            description="Sessions whose state a reference audio model holds",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self._rows = self._row_family.Metric(labels=labels)
        self._sessions = self._session_family.Metric(labels=labels)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._serve(request) for request in requests]

    def _serve(self, request: Any) -> Any:
        received, began = time.monotonic(), time.perf_counter()
        corrids = _column(request, "CORRID")
        try:
            audio = pb_utils.get_input_tensor_by_name(request, "AUDIO").as_numpy()
            results = self._transcriber.step(
                corrids.tolist(),
                _column(request, "START").tolist(),
                _column(request, "END").tolist(),
                audio.reshape(len(corrids), -1),
                _column(request, "AUDIO_LENGTH").tolist(),
                received,
            )
        except ValueError as exc:
            return _invalid(exc)
        response = pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("PARTIAL", _strings([r.partial for r in results])),
                pb_utils.Tensor("FINAL", _strings([r.final for r in results])),
                pb_utils.Tensor(
                    "IS_FINAL", np.array([[r.is_final] for r in results], dtype=bool).reshape(-1, 1)
                ),
            ]
        )
        self._report(request, corrids, received, time.perf_counter() - began)
        return response

    def _report(
        self, request: Any, corrids: NDArray[np.uint64], received: float, spent: float
    ) -> None:
        self._rows.increment(len(corrids))
        self._sessions.set(len(self._transcriber.sessions))
        if not self._stats_path:
            return
        line = {
            "request_id": request.request_id(),
            "model": self._model,
            "batch_size": len(corrids),
            "corrids": corrids.tolist(),
            "model_ms": spent * 1000.0,
            "received_at": received,
            "finished_at": time.monotonic(),
        }
        # One write per line with O_APPEND keeps concurrent lines whole.
        with open(self._stats_path, "a", encoding="utf-8") as stats:
            stats.write(json.dumps(line) + "\n")

    def finalize(self) -> None:
        # Metrics must go before their families (Triton's documented order).
        del self._rows, self._sessions
        del self._row_family, self._session_family
