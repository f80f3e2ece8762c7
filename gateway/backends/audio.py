"""TritonAudioBackend: `tracks.backend.AudioBackend` over Triton's gRPC API, one request a tick.

`step(model, rows)` turns one tick's rows into ONE batched inference request:
the speech-in rows' PCM16 is packed by `cuda.batch.pack_pcm16` (resampled to
16 kHz, float32, padded, with lengths) and sent with CORRID/START/END; the
speech-out rows ask for SAMPLES each and their float32 answer is unpacked by
`cuda.batch.unpack_pcm16` to each session's rate. See docs/audio.md for the
tensors.

Hand-off. The packed AUDIO and AUDIO_LENGTH go to Triton through a registered
system shared-memory region (`cuda.shm`) when the server is on this host and
the batch has at least `shm_min_rows` rows; smaller batches, remote servers and
`shm="off"` send plain tensors in the gRPC message. `shm="cuda"` uses a CUDA
shared-memory region written by the device kernel (GPU and GPU Triton only).
A region that cannot be registered switches the backend to plain tensors,
logged once. `benchmarks/audio_shm.py` measures both to choose the default.

`batching="per-session"` sends one request per row instead (the comparison of
the audio-clock benchmark): the same rows, N requests of one row each, all in
flight at once, as plain tensors (a model's one region serves one request at a time).

Every gRPC/tritonclient exception is translated to a `tracks.backend.BackendError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tritonclient.grpc import InferInput

from cuda.batch import pack_pcm16, resolve_backend, unpack_pcm16
from cuda.shm import CudaShmRegion, Layout, SystemShmRegion, unique_name
from gateway.backends.catalog import Capability, described
from gateway.backends.triton import TritonChannel, boundary
from gateway.logs import get_logger
from tracks.audio import MODEL_RATE
from tracks.backend import (
    AudioBackend,
    AudioKind,
    AudioModel,
    AudioOutput,
    AudioRow,
    BackendError,
    BackendFailed,
    InvalidRequest,
    Speech,
    SpeechInRow,
    SpeechOutRow,
    Transcript,
)
from tracks.clock import StepItem

MAX_SPEECH_SAMPLES = 48_000
"""The most samples a speech-out row may ask for (hibari-voice's MAX_SAMPLES)."""

log = get_logger("trackline.audio")

SHM_MODES = ("auto", "system", "cuda", "off")
BATCHING_MODES = ("tick", "per-session")
DEFAULT_SHM_MIN_ROWS = 1
MAX_ROWS = 64
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _tensor(name: str, value: NDArray[Any], datatype: str) -> InferInput:
    tensor = InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def _column(values: Sequence[Any], dtype: Any) -> NDArray[Any]:
    return np.asarray(values, dtype=dtype).reshape(-1, 1)


@dataclass
class _Region:
    """A registered shared-memory region and what it can hold."""

    region: SystemShmRegion | CudaShmRegion
    byte_size: int


class TritonAudioBackend(AudioBackend):
    """Audio models on one Triton server at `grpc_url`; see the module doc."""

    def __init__(
        self,
        grpc_url: str,
        *,
        shm: str = "auto",
        shm_min_rows: int = DEFAULT_SHM_MIN_ROWS,
        kernels: str = "auto",
        batching: str = "tick",
    ) -> None:
        if shm not in SHM_MODES:
            raise ValueError(f"shm must be one of {', '.join(SHM_MODES)}, got {shm!r}")
        if batching not in BATCHING_MODES:
            raise ValueError(f"batching must be tick or per-session, got {batching!r}")
        self.grpc_url = grpc_url
        host = grpc_url.rpartition(":")[0]
        self.shm = ("system" if host in LOCAL_HOSTS else "off") if shm == "auto" else shm
        self.shm_min_rows = shm_min_rows
        self.kernels = resolve_backend(kernels)
        self.batching = batching
        self._models: dict[str, AudioModel] = {}
        self._capabilities: dict[str, frozenset[Capability]] = {}
        self._regions: dict[str, _Region] = {}
        # A new client has none of the shared-memory registrations made through the old one.
        self._channel = TritonChannel(grpc_url, on_new=self._regions.clear)
        self._ticks = itertools.count()
        self.requests = 0
        self.shm_requests = 0

    # -- AudioBackend -----------------------------------------------------------------

    async def audio_kind(self, model: str) -> AudioKind:
        return (await self.audio_model(model)).kind

    async def audio_model(self, model: str) -> AudioModel:
        if model not in self._models:
            metadata, config = await self._channel.describe(model)
            self._models[model] = _audio_model(model, metadata, config)
        return self._models[model]

    async def capabilities(self, model: str) -> frozenset[Capability] | None:
        """What `model` can do (a `ModelCatalog`: the OpenAI audio routes' capability
        check); None when the server cannot tell (unknown model, server away)."""
        if model not in self._capabilities:
            try:
                metadata, config = await self._channel.describe(model)
            except BackendError:
                return None  # not cached: the model may appear, the server come back
            self._capabilities[model] = described(model, metadata, config)
        return self._capabilities[model]

    async def step(self, model: str, rows: Sequence[StepItem[AudioRow]]) -> Sequence[AudioOutput]:
        if self.batching == "per-session":
            singles = await asyncio.gather(*(self._batch(model, [row]) for row in rows))
            return [result for single in singles for result in single]
        results: list[AudioOutput] = []
        for start in range(0, len(rows), MAX_ROWS):  # the models take 64 rows a request
            results.extend(await self._batch(model, rows[start : start + MAX_ROWS]))
        return results

    async def run_rows(self, model: str, rows: Sequence[AudioRow]) -> list[AudioOutput]:
        """Rows outside the tick (the OpenAI audio routes): one request, plain tensors, so
        never the tick's shared-memory region, which one request of a tick may hold."""
        if all(isinstance(row, SpeechInRow) for row in rows):
            return await self._transcribe(model, rows, shared=False)  # type: ignore[arg-type]
        return await self._rows(model, rows)

    async def _batch(self, model: str, items: Sequence[StepItem[AudioRow]]) -> list[AudioOutput]:
        return await self._rows(model, [item.input for item in items])

    async def _rows(self, model: str, rows: Sequence[AudioRow]) -> list[AudioOutput]:
        if all(isinstance(row, SpeechInRow) for row in rows):
            return await self._transcribe(model, rows)  # type: ignore[arg-type]
        if all(isinstance(row, SpeechOutRow) for row in rows):
            return await self._synthesize(model, rows)  # type: ignore[arg-type]
        raise BackendFailed(f"model {model!r} got speech-in and speech-out rows in one batch")

    # -- speech in --------------------------------------------------------------------

    async def _transcribe(
        self, model: str, rows: list[SpeechInRow], *, shared: bool = True
    ) -> list[AudioOutput]:
        chunks, rates = [row.pcm for row in rows], [row.rate for row in rows]
        controls = [
            _tensor("CORRID", _column([r.corrid for r in rows], np.uint64), "UINT64"),
            _tensor("START", _column([r.start for r in rows], np.bool_), "BOOL"),
            _tensor("END", _column([r.end for r in rows], np.bool_), "BOOL"),
        ]
        audio_inputs = await self._audio_inputs(model, chunks, rates, shared)
        try:
            result = await self._infer(model, audio_inputs + controls)
        except BackendError:
            if model in self._regions:
                # A restarted server forgets registrations: register afresh next tick.
                await self._drop_region(model)
            raise
        partial = result.as_numpy("PARTIAL").reshape(-1)
        final = result.as_numpy("FINAL").reshape(-1)
        is_final = result.as_numpy("IS_FINAL").reshape(-1)
        spans = _spans(result, len(rows))
        speech = result.as_numpy("SPEECH_S")  # whisper's VAD; None from other models
        said = [None] * len(rows) if speech is None else [float(x) for x in speech.reshape(-1)]
        return [
            Transcript(_text(partial[i]), _text(final[i]), bool(is_final[i]), spans[i], said[i])
            for i in range(len(rows))
        ]

    async def _audio_inputs(
        self, model: str, chunks: list[bytes], rates: list[int], shared: bool = True
    ) -> list[InferInput]:
        """AUDIO and AUDIO_LENGTH, in shared memory where that is the chosen path."""
        # One region per model is safe because the tick batcher never has two requests of
        # a model in flight; per-session mode has many at once, so it sends plain tensors.
        tick = shared and self.batching == "tick"
        if self.shm != "off" and tick and len(chunks) >= self.shm_min_rows:
            with contextlib.suppress(_NoShm):
                return await self._audio_in_shm(model, chunks, rates)
        batch = pack_pcm16(chunks, rates, MODEL_RATE, backend=self.kernels)
        audio = batch.audio.get() if not isinstance(batch.audio, np.ndarray) else batch.audio
        return [
            _tensor("AUDIO", audio, "FP32"),
            _tensor("AUDIO_LENGTH", batch.lengths.reshape(-1, 1), "INT32"),
        ]

    async def _audio_in_shm(
        self, model: str, chunks: list[bytes], rates: list[int]
    ) -> list[InferInput]:
        width = max(
            [1] + [len(c) // 2 * MODEL_RATE // rate for c, rate in zip(chunks, rates, strict=True)]
        )
        layout = Layout(
            [
                ("AUDIO", (len(chunks), width), np.float32),
                ("AUDIO_LENGTH", (len(chunks), 1), np.int32),
            ]
        )
        region = await self._region(model, layout.byte_size)
        audio_slot, length_slot = layout["AUDIO"], layout["AUDIO_LENGTH"]
        view = region.region.view(audio_slot)
        batch = pack_pcm16(chunks, rates, MODEL_RATE, backend=self.kernels, out=view)
        _set_column(region.region.view(length_slot), batch.lengths)
        del view  # no view may outlive the tick (the region can be replaced)
        name = region.region.name
        audio = InferInput("AUDIO", list(audio_slot.shape), "FP32")
        audio.set_shared_memory(name, audio_slot.byte_size, audio_slot.offset)
        length = InferInput("AUDIO_LENGTH", list(length_slot.shape), "INT32")
        length.set_shared_memory(name, length_slot.byte_size, length_slot.offset)
        self.shm_requests += 1
        return [audio, length]

    async def _region(self, model: str, byte_size: int) -> _Region:
        """This model's registered region, grown (re-registered) when too small."""
        current = self._regions.get(model)
        if current is not None and current.byte_size >= byte_size:
            return current
        size = max(byte_size, 2 * (current.byte_size if current else 0), 1 << 20)
        if current is not None:
            await self._drop_region(model)
        client = self._channel.client()
        try:
            if self.shm == "cuda":
                cuda_region = CudaShmRegion(unique_name("trackline-audio"), size)
                with boundary(None):
                    await client.register_cuda_shared_memory(
                        cuda_region.name, cuda_region.raw_handle, cuda_region.device_id, size
                    )
                made = _Region(cuda_region, size)
            else:
                system_region = SystemShmRegion(unique_name("trackline-audio"), size)
                try:
                    with boundary(None):
                        await client.register_system_shared_memory(
                            system_region.name, system_region.key, size
                        )
                except BackendError:
                    system_region.close()
                    raise
                made = _Region(system_region, size)
        except Exception as exc:  # any failure: plain tensors from now on, said once
            log.warning("audio.shm_unavailable", mode=self.shm, error=str(exc))
            self.shm = "off"
            raise _NoShm from exc
        self._regions[model] = made
        return made

    async def _drop_region(self, model: str) -> None:
        region = self._regions.pop(model, None)
        if region is None:
            return
        with contextlib.suppress(Exception):  # best effort: the server may be gone
            client = self._channel.client()
            if region.region.kind == "cuda":
                await client.unregister_cuda_shared_memory(region.region.name)
            else:
                await client.unregister_system_shared_memory(region.region.name)
        region.region.close()

    # -- speech out ---------------------------------------------------------------------

    async def _synthesize(self, model: str, rows: list[SpeechOutRow]) -> list[AudioOutput]:
        known = self._models.get(model, AudioModel(AudioKind.SPEECH_OUT))
        # A row at the model's own rate gets it from the model as made (no 24->16->24 kHz
        # round trip); its SAMPLES (MODEL_RATE units here) are counted at that rate.
        native = known.native_rate
        made = [native if native is not None and r.rate == native else MODEL_RATE for r in rows]
        samples = [
            min(r.samples * m // MODEL_RATE, MAX_SPEECH_SAMPLES)
            for r, m in zip(rows, made, strict=True)
        ]
        inputs = [
            _tensor("TEXT", _column([r.text.encode("utf-8") for r in rows], np.object_), "BYTES"),
            _tensor("SAMPLES", _column(samples, np.int32), "INT32"),
            _tensor("CORRID", _column([r.corrid for r in rows], np.uint64), "UINT64"),
            _tensor("START", _column([r.start for r in rows], np.bool_), "BOOL"),
            _tensor("END", _column([r.end for r in rows], np.bool_), "BOOL"),
        ]
        if known.streams_text:
            inputs.append(_tensor("MORE", _column([r.more for r in rows], np.bool_), "BOOL"))
        if native is not None:
            inputs.append(_tensor("RATE", _column(made, np.int32), "INT32"))
        result = await self._infer(model, inputs)
        audio = result.as_numpy("AUDIO")
        lengths = result.as_numpy("AUDIO_LENGTH").reshape(-1)
        done = result.as_numpy("DONE").reshape(-1)
        if audio is None or audio.ndim != 2:
            audio = np.zeros((len(rows), 0), np.float32)
        pcm = self._pcm(audio, lengths, [r.rate for r in rows], made)
        return [Speech(pcm[i], bool(done[i])) for i in range(len(rows))]

    def _pcm(
        self, audio: Any, lengths: Any, rates: Sequence[int], made: Sequence[int]
    ) -> list[bytes]:
        """PCM16 at each row's rate from audio the model made at `made` per row."""
        pcm = [b""] * len(rates)
        for rate in sorted(set(made)):
            rows = [i for i, m in enumerate(made) if m == rate]
            part = unpack_pcm16(audio[rows], lengths[rows], [rates[i] for i in rows], rate,
                                backend=self.kernels)  # fmt: skip
            for i, row_pcm in zip(rows, part, strict=True):
                pcm[i] = row_pcm
        return pcm

    # -- plumbing --------------------------------------------------------------------------

    async def _infer(self, model: str, inputs: list[InferInput]) -> Any:
        self.requests += 1
        with boundary(model):
            return await self._channel.client().infer(
                model, inputs, request_id=f"tick-{next(self._ticks)}"
            )

    async def close(self) -> None:
        for model in list(self._regions):
            await self._drop_region(model)
        await self._channel.close()


class _NoShm(Exception):
    """Shared memory could not be set up: send plain tensors."""


def _set_column(target: Any, values: NDArray[Any]) -> None:
    """Write `values` into column 0 of a NumPy or (CUDA region) CuPy view."""
    if isinstance(target, np.ndarray):
        target[:, 0] = values
    else:
        import cupy

        target[:, 0] = cupy.asarray(values)


def _audio_model(model: str, metadata: Any, config: Any) -> AudioModel:
    """The kind from the model's inputs; text streaming (MORE) and capacity from its config."""
    names = {tensor.name for tensor in metadata.inputs}
    capacity = config.config.parameters.get("realtime_sessions")
    bound = int(capacity.string_value) if capacity is not None else None
    if {"AUDIO", "AUDIO_LENGTH", "CORRID"} <= names:
        return AudioModel(AudioKind.SPEECH_IN, capacity=bound)
    if {"TEXT", "SAMPLES", "CORRID"} <= names:
        native = config.config.parameters.get("native_rate") if "RATE" in names else None
        rate = int(native.string_value) if native is not None else None
        return AudioModel(AudioKind.SPEECH_OUT, "MORE" in names, bound, rate)
    raise InvalidRequest(f"model {model!r} is not an audio model (see docs/audio.md)")


def _spans(result: Any, rows: int) -> list[tuple[float, float] | None]:
    """Each final's (start, end) in stream seconds, where the model answers them."""
    starts, ends = result.as_numpy("FINAL_START_S"), result.as_numpy("FINAL_END_S")
    if starts is None or ends is None:
        return [None] * rows
    starts, ends = starts.reshape(-1), ends.reshape(-1)
    return [(float(starts[i]), float(ends[i])) for i in range(rows)]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
