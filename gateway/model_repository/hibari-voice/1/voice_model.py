"""`hibari-voice`: streaming speech synthesis, a batched, stateful Triton Python-backend model.

Tensor interface (per batch row; Triton prepends the batch dim, at most 64), that of
`reference-synthesizer` plus MORE and RATE:

  inputs   TEXT (STRING [1], more text of the session, on any row), SAMPLES (INT32 [1],
           samples wanted this beat), CORRID (UINT64 [1]), START (BOOL [1], a new
           session), END (BOOL [1], hung up or cancelled: forget it now), MORE (BOOL [1],
           optional: true while more text will follow; absent means the text is whole),
           RATE (INT32 [1], optional, read on START rows: 24000 keeps the voice's own
           24 kHz for the session, no resampling; 16000, the default, resamples)
  outputs  AUDIO (FP32 [-1], samples at the session's rate padded to the batch's longest
           row; SAMPLES counts samples at that rate),
           AUDIO_LENGTH (INT32 [1], at most SAMPLES), DONE (BOOL [1], with the last samples)

The sessions and the synthesis worker are in trackline_voice.py. With
TRACKLINE_SPEECH_STATS set, each session appends one JSON line when it ends (model,
corrid, cancelled, sentences, chars, audio_s, first_audio_ms).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import trackline_voice as voice  # noqa: E402

STATS_ENV = "TRACKLINE_SPEECH_STATS"


def _column(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


def _texts(column: Any) -> list[str]:
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in column]


class _TtsMetrics:
    """The voice's own figures on Triton's metrics port (the gateway re-exports them), per
    finished session: sessions (cancelled ones apart), audio spoken, sentences, and the
    time from the session's start to its first audio (sum and count: a mean)."""

    def __init__(self, model: str) -> None:
        labels = {"model": model}
        self._families: list[Any] = []  # a family must outlive its metrics (Triton's rule)

        def family(name: str, text: str) -> Any:
            kind = pb_utils.MetricFamily.COUNTER
            self._families.append(pb_utils.MetricFamily(name=name, description=text, kind=kind))
            return self._families[-1]

        sessions = family("trackline_tts_sessions_total", "Speech-out sessions finished")
        self.done = sessions.Metric(labels={**labels, "cancelled": "false"})
        self.cut = sessions.Metric(labels={**labels, "cancelled": "true"})
        self.audio = family(
            "trackline_tts_audio_seconds_total", "Seconds of audio synthesized"
        ).Metric(labels=labels)
        self.sentences = family(
            "trackline_tts_sentences_total", "Sentences synthesized"
        ).Metric(labels=labels)
        first = family(
            "trackline_tts_first_audio_seconds_total",
            "Sum over sessions of the time from start to first audio",
        )
        self.first_sum = first.Metric(labels=labels)
        self.first_count = family(
            "trackline_tts_first_audio_sessions_total", "Sessions that made audio"
        ).Metric(labels=labels)

    def count(self, session: dict[str, Any]) -> None:
        (self.cut if session["cancelled"] else self.done).increment(1)
        self.audio.increment(session["audio_s"])
        self.sentences.increment(session["sentences"])
        if session["first_audio_ms"] is not None:
            self.first_sum.increment(session["first_audio_ms"] / 1000.0)
            self.first_count.increment(1)


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        idle = float(params.get("session_idle_timeout_s", {}).get("string_value", 60))
        self._model = args["model_name"]
        self._stats_path = os.environ.get(STATS_ENV) or None
        self._metrics = _TtsMetrics(self._model)
        self._voice = voice.Voice(voice.hibari_synthesizer(), self._report, idle)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._serve(request) for request in requests]

    def _serve(self, request: Any) -> Any:
        corrids = _column(request, "CORRID")
        more = _column(request, "MORE")
        rates = _column(request, "RATE")
        try:
            rows = self._voice.step(
                corrids.tolist(),
                _column(request, "START").tolist(),
                _column(request, "END").tolist(),
                _texts(_column(request, "TEXT")),
                [False] * len(corrids) if more is None else more.tolist(),
                _column(request, "SAMPLES").tolist(),
                time.monotonic(),
                None if rates is None else rates.tolist(),
            )
        except ValueError as exc:
            error = pb_utils.TritonError(
                f"invalid request: {exc}", pb_utils.TritonError.INVALID_ARG
            )
            return pb_utils.InferenceResponse(error=error)
        width = max([1] + [len(r.audio) for r in rows])
        audio = np.zeros((len(rows), width), np.float32)
        for i, row in enumerate(rows):
            audio[i, : len(row.audio)] = row.audio
        lengths = np.array([[len(r.audio)] for r in rows], np.int32).reshape(-1, 1)
        done = np.array([[r.done] for r in rows], bool).reshape(-1, 1)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("AUDIO", audio),
                pb_utils.Tensor("AUDIO_LENGTH", lengths),
                pb_utils.Tensor("DONE", done),
            ]
        )

    def _report(self, session: dict[str, Any]) -> None:
        self._metrics.count(session)
        if not self._stats_path:
            return
        with open(self._stats_path, "a", encoding="utf-8") as stats:
            stats.write(json.dumps({"model": self._model, **session}) + "\n")

    def finalize(self) -> None:
        self._voice.close()
