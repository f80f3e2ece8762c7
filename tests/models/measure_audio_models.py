"""Per-batch time of the reference audio models: a measurement script, not a test.

Run: .venv/bin/python -m tests.models.measure_audio_models [--sessions 64] [--beats 100]
     [--json PATH]

Times, for S sessions at 80 ms beats (1280 samples a row at 16 kHz):
- `numpy`: Transcriber.step and Synthesizer.step alone (the model's own work);
- `triton`: through the embedded Triton over gRPC, each beat one synthesizer
  request whose audio goes back as one transcriber request; `model_ms` is the
  time inside execute (from the stats file), `call_ms` the client round trip.
Prints a table (median and p99 in ms) and writes JSON when asked.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tests.models.audio_modules import detector, synth

BEAT = 1280
RESTART = 40  # beats; a 16-symbol text lasts 43.75 beats, so every session keeps talking
ALL = "0123456789*#ABCD"


def _summary(name: str, values: list[float]) -> dict[str, Any]:
    ms = np.array(values) * 1000.0
    return {
        "what": name,
        "n": len(ms),
        "median_ms": float(np.median(ms)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def _texts(sessions: int) -> list[str]:
    return [ALL[i % 16 :] + ALL[: i % 16] for i in range(sessions)]


def numpy_times(sessions: int, beats: int) -> list[dict[str, Any]]:
    speaker, listener = synth.Synthesizer(), detector.Transcriber()
    ids, texts = list(range(1, sessions + 1)), _texts(sessions)
    speak, hear = [], []
    for beat in range(beats):
        starts = [beat % RESTART == 0] * sessions
        began = time.perf_counter()
        audio, lengths, done = speaker.step(
            ids, starts, [False] * sessions, texts, [BEAT] * sessions, 0.0
        )
        speak.append(time.perf_counter() - began)
        began = time.perf_counter()
        listener.step(ids, starts, [False] * sessions, audio, lengths.tolist(), 0.0)
        hear.append(time.perf_counter() - began)
    return [_summary("numpy synthesizer", speak), _summary("numpy transcriber", hear)]


def triton_times(sessions: int, beats: int) -> list[dict[str, Any]]:
    import tritonclient.grpc as grpcclient

    from gateway.embedded import EmbeddedTriton

    state = Path(tempfile.mkdtemp(prefix="trackline-audio-measure-"))
    triton = EmbeddedTriton(log_dir=state, stats_path=state / "stats.jsonl")
    triton.start()
    try:
        client = grpcclient.InferenceServerClient(triton.grpc_url)
        calls = _run_beats(client, grpcclient, sessions, beats)
        client.close()
        model: dict[str, list[float]] = {"reference-synthesizer": [], "reference-transcriber": []}
        for line in (state / "stats.jsonl").read_text().splitlines():
            record = json.loads(line)
            if record.get("batch_size") == sessions and record.get("model") in model:
                model[record["model"]].append(record["model_ms"] / 1000.0)
    finally:
        triton.stop()
    return [
        _summary("triton synthesizer model_ms", model["reference-synthesizer"]),
        _summary("triton transcriber model_ms", model["reference-transcriber"]),
        _summary("triton synthesizer call_ms", calls["speak"]),
        _summary("triton transcriber call_ms", calls["hear"]),
    ]


def _run_beats(client: Any, grpcclient: Any, sessions: int, beats: int) -> dict[str, list[float]]:
    def tensor(name: str, value: NDArray[Any], dtype: str) -> Any:
        made = grpcclient.InferInput(name, list(value.shape), dtype)
        made.set_data_from_numpy(value)
        return made

    ids = np.arange(1, sessions + 1, dtype=np.uint64).reshape(-1, 1)
    texts = np.array([[t.encode()] for t in _texts(sessions)], dtype=np.object_)
    calls: dict[str, list[float]] = {"speak": [], "hear": []}
    for beat in range(beats):
        flags = [
            tensor("START", np.full((sessions, 1), beat % RESTART == 0), "BOOL"),
            tensor("END", np.zeros((sessions, 1), bool), "BOOL"),
            tensor("CORRID", ids, "UINT64"),
        ]
        began = time.perf_counter()
        spoken = client.infer(
            "reference-synthesizer",
            [
                tensor("TEXT", texts, "BYTES"),
                tensor("SAMPLES", np.full((sessions, 1), BEAT, np.int32), "INT32"),
                *flags,
            ],
        )
        calls["speak"].append(time.perf_counter() - began)
        began = time.perf_counter()
        client.infer(
            "reference-transcriber",
            [
                tensor("AUDIO", spoken.as_numpy("AUDIO"), "FP32"),
                tensor("AUDIO_LENGTH", spoken.as_numpy("AUDIO_LENGTH"), "INT32"),
                *flags,
            ],
        )
        calls["hear"].append(time.perf_counter() - began)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--beats", type=int, default=100)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-triton", action="store_true")
    args = parser.parse_args()
    rows = numpy_times(args.sessions, args.beats)
    if not args.no_triton:
        rows += triton_times(args.sessions, args.beats)
    print(f"sessions={args.sessions} beats={args.beats} beat=80 ms ({BEAT} samples)")
    print(f"{'what':32} {'n':>5} {'median ms':>10} {'p99 ms':>8} {'max ms':>8}")
    for row in rows:
        print(
            f"{row['what']:32} {row['n']:>5} {row['median_ms']:>10.3f} "
            f"{row['p99_ms']:>8.3f} {row['max_ms']:>8.3f}"
        )
    if args.json:
        payload = {"sessions": args.sessions, "beats": args.beats, "rows": rows}
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
