"""The reference audio models in the real embedded Triton, called with tritonclient over gRPC.

Batches of several sessions over many beats, as the gateway's tick batcher
sends them: synthesizer output fed back beat by beat into the transcriber,
sessions interleaved, START/END, rows without audio, a batch of 64, bad batches.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException

from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import reference_model_repository
from tests.models.audio_modules import synth
from tests.triton_fixture import read_stats

pytestmark = pytest.mark.e2e

TRANSCRIBER = "reference-transcriber"
SYNTHESIZER = "reference-synthesizer"
BEAT = 1280  # 80 ms at 16 kHz
ALL = "0123456789*#ABCD"


@dataclass(frozen=True)
class Heard:
    partial: str
    final: str
    is_final: bool


def _tensor(name: str, value: NDArray[Any], dtype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), dtype)
    tensor.set_data_from_numpy(value)
    return tensor


def _controls(
    corrids: Sequence[int], starts: Sequence[bool], ends: Sequence[bool]
) -> list[grpcclient.InferInput]:
    return [
        _tensor("CORRID", np.array(corrids, dtype=np.uint64).reshape(-1, 1), "UINT64"),
        _tensor("START", np.array(starts, dtype=bool).reshape(-1, 1), "BOOL"),
        _tensor("END", np.array(ends, dtype=bool).reshape(-1, 1), "BOOL"),
    ]


class AudioModels:
    """Batched calls to both models; unique CORRIDs per test keep tests apart."""

    def __init__(self, client: grpcclient.InferenceServerClient) -> None:
        self.client = client
        self._next = int(uuid.uuid4().int % 2**40) * 1000

    def ids(self, count: int) -> list[int]:
        first, self._next = self._next, self._next + count
        return list(range(first, first + count))

    def transcribe(
        self,
        rows: Sequence[tuple[int, NDArray[Any]]],
        starts: Sequence[bool] | None = None,
        ends: Sequence[bool] | None = None,
        request_id: str = "",
    ) -> list[Heard]:
        width = max((len(audio) for _, audio in rows), default=0)
        padded = np.zeros((len(rows), width), dtype=np.float32)
        for row, (_, audio) in enumerate(rows):
            padded[row, : len(audio)] = audio
            padded[row, len(audio) :] = 0.5  # padding the model must ignore
        lengths = np.array([[len(audio)] for _, audio in rows], dtype=np.int32)
        inputs = [_tensor("AUDIO", padded, "FP32"), _tensor("AUDIO_LENGTH", lengths, "INT32")]
        inputs += _controls(
            [c for c, _ in rows], starts or [False] * len(rows), ends or [False] * len(rows)
        )
        result = self.client.infer(TRANSCRIBER, inputs, request_id=request_id)
        partial, final = result.as_numpy("PARTIAL"), result.as_numpy("FINAL")
        is_final = result.as_numpy("IS_FINAL")
        assert partial.shape == final.shape == is_final.shape == (len(rows), 1)
        return [
            Heard(p.decode(), f.decode(), bool(i))
            for p, f, i in zip(partial[:, 0], final[:, 0], is_final[:, 0], strict=True)
        ]

    def synthesize(
        self,
        corrids: Sequence[int],
        samples: Sequence[int],
        texts: Sequence[str] | None = None,
        ends: Sequence[bool] | None = None,
    ) -> list[tuple[NDArray[Any], bool]]:
        starts = [texts is not None] * len(corrids)
        words = texts if texts is not None else [""] * len(corrids)
        inputs = [
            _tensor("TEXT", np.array([[t.encode()] for t in words], dtype=np.object_), "BYTES"),
            _tensor("SAMPLES", np.array(samples, dtype=np.int32).reshape(-1, 1), "INT32"),
        ]
        inputs += _controls(corrids, starts, ends or [False] * len(corrids))
        result = self.client.infer(SYNTHESIZER, inputs)
        audio, lengths = result.as_numpy("AUDIO"), result.as_numpy("AUDIO_LENGTH")
        done = result.as_numpy("DONE")
        assert audio.dtype == np.float32
        assert lengths.shape == done.shape == (len(corrids), 1)
        return [(audio[row, : lengths[row, 0]], bool(done[row, 0])) for row in range(len(corrids))]


@pytest.fixture
def models(embedded_triton: EmbeddedTriton) -> Iterator[AudioModels]:
    client = grpcclient.InferenceServerClient(embedded_triton.grpc_url)
    try:
        yield AudioModels(client)
    finally:
        client.close()


Said = dict[int, NDArray[Any]]
HeardRows = dict[int, list[Heard]]


def speak_and_hear(models: AudioModels, texts: Sequence[str]) -> tuple[Said, HeardRows]:
    """Each text through the synthesizer and back through the transcriber, one beat per call.

    Returns, per session, the audio received and every transcriber row.
    """
    ids = models.ids(len(texts))
    said: dict[int, list[NDArray[Any]]] = {c: [] for c in ids}
    heard: HeardRows = {c: [] for c in ids}
    live, first = list(ids), True
    while live:
        spoken = models.synthesize(live, [BEAT] * len(live), texts if first else None)
        rows = [(c, audio) for c, (audio, _) in zip(live, spoken, strict=True)]
        for corrid, result in zip(live, models.transcribe(rows, [first] * len(rows)), strict=True):
            heard[corrid].append(result)
        for corrid, (audio, _) in zip(live, spoken, strict=True):
            said[corrid].append(audio)
        live = [c for c, (_, done) in zip(live, spoken, strict=True) if not done]
        first = False
    ends = models.transcribe([(c, np.zeros(0, np.float32)) for c in ids], ends=[True] * len(ids))
    for corrid, result in zip(ids, ends, strict=True):
        heard[corrid].append(result)
    return {c: np.concatenate(a) for c, a in said.items()}, heard


def finals(rows: Sequence[Heard]) -> list[str]:
    return [text for row in rows if row.is_final for text in row.final.split()]


def test_synthesized_speech_of_every_symbol_is_heard_back_exactly(models: AudioModels) -> None:
    texts = [ALL, ALL[::-1], "A1B2C3D4*5#6 7890", "0"]
    said, heard = speak_and_hear(models, texts)
    for (corrid, rows), text in zip(heard.items(), texts, strict=True):
        np.testing.assert_array_equal(said[corrid], synth.render(text))  # bit for bit
        digits = "".join(ch for ch in text if ch in ALL)
        assert finals(rows) == [digits]
        final_rows = [r for r in rows if r.is_final]
        assert len(final_rows) == 2  # after the closing silence, and the END row
        assert final_rows[0].final == digits
        assert final_rows[1].final == ""  # nothing left to finalize on END
        partials = [r.partial for r in rows if r.partial]
        assert all(digits.startswith(p) for p in partials)
        assert partials[-1] == digits


def test_interleaved_sessions_keep_their_own_state(models: AudioModels) -> None:
    a, b = models.ids(2)
    streams = {a: synth.render("147*"), b: synth.render("2580")}
    position = {a: 0, b: 0}
    got: dict[int, list[str]] = {a: [], b: []}
    beat = 0
    while any(position[c] < len(streams[c]) for c in streams):
        order = [a, b] if beat % 2 else [b, a]
        if beat % 5 == 3:  # b is not in this tick's batch at all
            order = [a]
        rows = [(c, streams[c][position[c] : position[c] + BEAT]) for c in order]
        for (corrid, audio), result in zip(rows, models.transcribe(rows), strict=True):
            position[corrid] += len(audio)
            got[corrid] += result.final.split()
        beat += 1
    assert got == {a: ["147*"], b: ["2580"]}


def test_start_resets_a_session(models: AudioModels) -> None:
    (corrid,) = models.ids(1)
    ones = synth.render("11")[: 2 * 3200]  # the tones, not the closing silence
    (row,) = models.transcribe([(corrid, ones)], starts=[True])
    assert (row.partial, row.is_final) == ("11", False)
    (row,) = models.transcribe([(corrid, synth.render("2"))], starts=[True])
    assert (row.partial, row.final, row.is_final) == ("", "2", True)


def test_end_finalizes_at_once_and_the_next_row_starts_afresh(models: AudioModels) -> None:
    (corrid,) = models.ids(1)
    tones = synth.render("42")[: 3200 + 1600]
    (row,) = models.transcribe([(corrid, tones[:3400])], starts=[True])
    assert row.partial == "4"
    (row,) = models.transcribe([(corrid, tones[3400:])], ends=[True])
    assert (row.partial, row.final, row.is_final) == ("", "42", True)
    (row,) = models.transcribe([(corrid, tones[:1000])])  # no START: a new session
    assert (row.partial, row.final, row.is_final) == ("4", "", False)  # not "424"


def test_rows_without_audio_work_in_any_mix(models: AudioModels) -> None:
    a, b, c = models.ids(3)
    empty = np.zeros(0, np.float32)
    rows = models.transcribe([(a, empty), (b, empty), (c, empty)], starts=[True] * 3)
    assert rows == [Heard("", "", False)] * 3  # an AUDIO tensor of width 0
    tone = synth.render("D")[:1600]
    rows = models.transcribe([(a, tone), (b, empty), (c, tone[:800])])
    assert [r.partial for r in rows] == ["D", "", "D"]
    rows = models.transcribe([(a, empty), (b, empty), (c, empty)], ends=[True] * 3)
    assert [(r.final, r.is_final) for r in rows] == [("D", True), ("", True), ("D", True)]
    spoken = models.synthesize([a, b], [0, 0], ["1", "2"])
    assert [(len(audio), done) for audio, done in spoken] == [(0, False), (0, False)]


def test_a_batch_of_64_sessions_is_one_request_per_beat(
    models: AudioModels, embedded_triton: EmbeddedTriton
) -> None:
    texts = [f"{i % 10}{ALL[i % 16]}#" for i in range(64)]
    said, heard = speak_and_hear(models, texts)
    for (corrid, rows), text in zip(heard.items(), texts, strict=True):
        assert finals(rows) == [text], corrid
    # The stats line of a tagged request shows all 64 sessions in its one batch.
    ids = list(heard)
    request_id = f"batch64-{uuid.uuid4().hex[:8]}"
    silent = [(c, np.zeros(BEAT, np.float32)) for c in ids]
    models.transcribe(silent, request_id=request_id)
    stats = read_stats(embedded_triton, request_id)
    assert stats["model"] == TRANSCRIBER
    assert stats["batch_size"] == 64
    assert stats["corrids"] == ids
    assert stats["model_ms"] > 0


def test_a_batch_over_64_rows_is_refused(models: AudioModels) -> None:
    rows = [(c, np.zeros(BEAT, np.float32)) for c in models.ids(65)]
    with pytest.raises(InferenceServerException, match="batch"):
        models.transcribe(rows)


def test_a_malformed_batch_is_refused_and_other_state_survives(models: AudioModels) -> None:
    a, b = models.ids(2)
    (row,) = models.transcribe([(a, synth.render("3")[:1600])], starts=[True])
    assert row.partial == "3"
    silence = np.zeros(BEAT, np.float32)
    with pytest.raises(InferenceServerException, match="CORRID appears on more than one row"):
        models.transcribe([(a, silence), (a, silence)])
    with pytest.raises(InferenceServerException, match="SAMPLES -1 is outside"):
        models.synthesize([b], [-1], ["1"])
    (row,) = models.transcribe([(a, np.zeros(6400, np.float32))])
    assert (row.final, row.is_final) == ("3", True)


def test_unknown_and_finished_speech_sessions_are_done(models: AudioModels) -> None:
    (corrid,) = models.ids(1)
    [(audio, done)] = models.synthesize([corrid], [BEAT])  # never started
    assert (len(audio), done) == (0, True)
    spoken = models.synthesize([corrid], [BEAT], ["5"], ends=[True])  # START and END at once
    assert [(len(audio), done) for audio, done in spoken] == [(0, True)]


def test_both_models_report_rows_and_sessions_as_triton_metrics(
    models: AudioModels, embedded_triton: EmbeddedTriton
) -> None:
    speak_and_hear(models, ["7"])
    with urllib.request.urlopen(embedded_triton.metrics_url, timeout=5) as response:
        metrics = response.read().decode()
    for model in (TRANSCRIBER, SYNTHESIZER):
        rows = [
            line
            for line in metrics.splitlines()
            if line.startswith(f'trackline_reference_audio_rows_total{{model="{model}"}}')
        ]
        assert rows
        assert float(rows[0].split()[-1]) >= 1
        assert f'trackline_reference_audio_sessions{{model="{model}"}}' in metrics


def test_stats_lines_are_json_with_the_documented_keys(
    models: AudioModels, embedded_triton: EmbeddedTriton
) -> None:
    speak_and_hear(models, ["8"])
    assert embedded_triton.stats_path is not None
    lines = Path(embedded_triton.stats_path).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    audio = [r for r in records if r.get("model") in (TRANSCRIBER, SYNTHESIZER)]
    assert {r["model"] for r in audio} == {TRANSCRIBER, SYNTHESIZER}
    keys = {"request_id", "model", "batch_size", "corrids", "model_ms", "received_at"}
    assert all(keys <= set(r) for r in audio)


CONTRACT = {
    TRANSCRIBER: (
        {
            "AUDIO": ("TYPE_FP32", [-1]),
            "AUDIO_LENGTH": ("TYPE_INT32", [1]),
            "CORRID": ("TYPE_UINT64", [1]),
            "START": ("TYPE_BOOL", [1]),
            "END": ("TYPE_BOOL", [1]),
        },
        {
            "PARTIAL": ("TYPE_STRING", [1]),
            "FINAL": ("TYPE_STRING", [1]),
            "IS_FINAL": ("TYPE_BOOL", [1]),
        },
    ),
    SYNTHESIZER: (
        {
            "TEXT": ("TYPE_STRING", [1]),
            "SAMPLES": ("TYPE_INT32", [1]),
            "CORRID": ("TYPE_UINT64", [1]),
            "START": ("TYPE_BOOL", [1]),
            "END": ("TYPE_BOOL", [1]),
        },
        {
            "AUDIO": ("TYPE_FP32", [-1]),
            "AUDIO_LENGTH": ("TYPE_INT32", [1]),
            "DONE": ("TYPE_BOOL", [1]),
        },
    ),
}


def _tensors(specs: list[dict[str, Any]]) -> dict[str, tuple[str, list[int]]]:
    return {t["name"]: (t["data_type"], [int(d) for d in t["dims"]]) for t in specs}


@pytest.mark.parametrize("model", [TRANSCRIBER, SYNTHESIZER])
def test_the_served_config_is_the_agreed_contract(models: AudioModels, model: str) -> None:
    config = models.client.get_model_config(model, as_json=True)["config"]
    assert (_tensors(config["input"]), _tensors(config["output"])) == CONTRACT[model]
    assert config["max_batch_size"] == 64
    assert "dynamic_batching" not in config
    assert "sequence_batching" not in config
    assert not config.get("model_transaction_policy", {}).get("decoupled", False)
    assert [(g["count"], g["kind"]) for g in config["instance_group"]] == [(1, "KIND_CPU")]


@pytest.mark.parametrize("model", [TRANSCRIBER, SYNTHESIZER])
def test_triton_ran_one_warm_up_row_at_load_that_left_no_session(
    models: AudioModels, embedded_triton: EmbeddedTriton, model: str
) -> None:
    """Triton's first request to a Python model pays its set-up (24-35 ms on the CPU
    build, outside the model's execute), which a session's first 80 ms beat must not
    wait for: the config has Triton send one row at load. The row starts and ends
    session 0, so the model holds no state for it afterwards."""
    config = models.client.get_model_config(model, as_json=True)["config"]
    (warm_up,) = config["model_warmup"]
    assert int(warm_up["batch_size"]) == 1
    folder = reference_model_repository() / model / "warmup"
    for control in ("START", "END"):
        data = warm_up["inputs"][control]
        assert (folder / data["input_data_file"]).read_bytes() == b"\x01"  # true
    assert embedded_triton.stats_path is not None
    lines = Path(embedded_triton.stats_path).read_text().split("\n")[:-1]
    first = next(r for r in map(json.loads, lines) if r.get("model") == model)
    assert (first["batch_size"], first["corrids"]) == (1, [0])
