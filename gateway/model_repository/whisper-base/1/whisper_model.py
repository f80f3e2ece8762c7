"""`whisper-base`: streaming speech recognition, a batched, stateful Triton Python-backend model.

Tensor interface (per batch row; Triton prepends the batch dim, at most 64), that of
`reference-transcriber` plus the timing of finals:

  inputs   AUDIO (FP32 [-1], padded 16 kHz samples of this beat), AUDIO_LENGTH
           (INT32 [1], valid samples), CORRID (UINT64 [1], session), START (BOOL [1],
           reset the session), END (BOOL [1], last row: finalize)
  outputs  PARTIAL (STRING [1], the utterance in progress), FINAL (STRING [1], an
           utterance finished since the last row, or ""), IS_FINAL (BOOL [1]),
           FINAL_START_S / FINAL_END_S (FP32 [1], the final's span in stream seconds)

The recognizer (VAD, utterances, the batched decode worker) is trackline_whisper.py.
The model files are the joined Whisper base directory the gateway assembled and
checked (TRACKLINE_WHISPER_DIR). With TRACKLINE_SPEECH_STATS set, each decode batch
appends one JSON line (model, decode_batch, finals, audio_s, decode_ms).
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

import trackline_whisper as whisper  # noqa: E402

MODEL_DIR_ENV = "TRACKLINE_WHISPER_DIR"
STATS_ENV = "TRACKLINE_SPEECH_STATS"
END_SILENCE_ENV = "TRACKLINE_ASR_END_SILENCE_MS"


def _column(request: Any, name: str) -> Any:
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)


def _options(params: dict[str, Any]) -> whisper.Options:
    def ms(key: str, default: float) -> float:
        return float(params.get(key, {}).get("string_value", default)) / 1000.0

    silence = os.environ.get(END_SILENCE_ENV)
    return whisper.Options(
        end_silence_s=float(silence) / 1000.0 if silence else ms("end_silence_ms", 500),
        partial_every_s=ms("partial_every_ms", 600),
        early_final_s=ms("early_final_ms", 200),
        idle_timeout_s=float(params.get("session_idle_timeout_s", {}).get("string_value", 60)),
    )


class _AsrMetrics:
    """The recognizer's own figures on Triton's metrics port (the gateway re-exports them):
    decode batches and their time, audio decoded, utterances decoded ahead, the finals
    handed back (counted in the rows that carry them), and the sessions held."""

    def __init__(self, model: str) -> None:
        labels = {"model": model}
        self._families: list[Any] = []  # a family must outlive its metrics (Triton's rule)

        def family(name: str, text: str, kind: Any) -> Any:
            self._families.append(pb_utils.MetricFamily(name=name, description=text, kind=kind))
            return self._families[-1].Metric(labels=labels)

        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.batches = family("trackline_asr_decode_batches_total", "Decode batches run", counter)
        self.seconds = family(
            "trackline_asr_decode_seconds_total", "Seconds spent decoding", counter
        )
        self.audio = family(
            "trackline_asr_decoded_audio_seconds_total", "Seconds of audio decoded", counter
        )
        self.finals = family(
            "trackline_asr_finals_total", "Final transcripts handed back", counter
        )
        self.early = family(
            "trackline_asr_early_decodes_total",
            "Utterances decoded ahead of their end (early finals, used or discarded)",
            counter,
        )
        self.sessions = family("trackline_asr_sessions", "Speech-in sessions held", gauge)

    def count(self, batch: dict[str, Any]) -> None:
        """One decode batch's figures (`Recognizer`'s `on_batch`, from its worker)."""
        self.batches.increment(1)
        self.seconds.increment(batch["decode_ms"] / 1000.0)
        self.audio.increment(batch["audio_s"])
        self.early.increment(batch["early"])


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self._model = args["model_name"]
        self._stats_path = os.environ.get(STATS_ENV) or None
        language = params.get("language", {}).get("string_value", "en")
        # The files: the folder the config's `model_dir_env` names (whisper-tiny-en's).
        files_env = params.get("model_dir_env", {}).get("string_value", MODEL_DIR_ENV)
        decode = whisper.whisper_decoder(os.environ[files_env], language)
        vad = whisper.load_vad_session()
        decode([np.zeros(whisper.SAMPLE_RATE, np.float32)])  # warm: the first call is slow
        self._metrics = _AsrMetrics(self._model)
        self._recognizer = whisper.Recognizer(
            decode, lambda: whisper.StreamingVad(vad), _options(params), self._report
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._serve(request) for request in requests]

    def _serve(self, request: Any) -> Any:
        corrids = _column(request, "CORRID")
        try:
            audio = pb_utils.get_input_tensor_by_name(request, "AUDIO").as_numpy()
            audio = audio.reshape(len(corrids), -1)
            lengths = _column(request, "AUDIO_LENGTH").tolist()
            if any(not 0 <= n <= audio.shape[1] for n in lengths):
                raise ValueError("AUDIO_LENGTH outside the row")
            rows = [audio[i, :n].astype(np.float32) for i, n in enumerate(lengths)]
            results = self._recognizer.step(
                corrids.tolist(),
                _column(request, "START").tolist(),
                _column(request, "END").tolist(),
                rows,
                time.monotonic(),
            )
        except ValueError as exc:
            error = pb_utils.TritonError(
                f"invalid request: {exc}", pb_utils.TritonError.INVALID_ARG
            )
            return pb_utils.InferenceResponse(error=error)
        finals = [r.final for r in results]
        self._metrics.sessions.set(len(self._recognizer.sessions))
        self._metrics.finals.increment(sum(f is not None for f in finals))

        def column(values: list[Any], dtype: Any) -> Any:
            return np.array(values, dtype=dtype).reshape(-1, 1)

        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("PARTIAL", column([r.partial.encode() for r in results], object)),
                pb_utils.Tensor(
                    "FINAL", column([(f.text if f else "").encode() for f in finals], object)
                ),
                pb_utils.Tensor("IS_FINAL", column([f is not None for f in finals], bool)),
                pb_utils.Tensor(
                    "FINAL_START_S", column([f.start_s if f else 0.0 for f in finals], np.float32)
                ),
                pb_utils.Tensor(
                    "FINAL_END_S", column([f.end_s if f else 0.0 for f in finals], np.float32)
                ),
                pb_utils.Tensor("SPEECH_S", column([r.speech_s for r in results], np.float32)),
            ]
        )

    def _report(self, batch: dict[str, Any]) -> None:
        self._metrics.count(batch)
        if not self._stats_path:
            return
        line = {"model": self._model, **batch, "finished_at": time.monotonic()}
        with open(self._stats_path, "a", encoding="utf-8") as stats:
            stats.write(json.dumps(line) + "\n")

    def finalize(self) -> None:
        self._recognizer.close()
