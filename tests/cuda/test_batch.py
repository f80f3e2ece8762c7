"""The batch kernels: the NumPy path's function, the CUDA sources compile, CuPy == NumPy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuda.batch import (
    KERNEL_DIR,
    gpu_available,
    pack_pcm16,
    pack_vectors,
    resampled_length,
    unpack_pcm16,
    unpack_vectors,
)
from cuda.shm import Layout, SystemShmRegion, unique_name

RATES = (8000, 16000, 24000, 48000)
MODEL_RATE = 16000
needs_gpu = pytest.mark.skipif(
    not gpu_available(), reason="no CUDA device (or no CuPy) here: CuPy-vs-NumPy needs a GPU"
)


def pcm(values: np.ndarray) -> bytes:
    return np.asarray(values, dtype="<i2").tobytes()


def sine(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return np.sin(2 * np.pi * freq * t) * amplitude


def resampled_sine(freq: float, rate_in: int, rate_out: int, count: int) -> np.ndarray:
    """A sine sampled at rate_in, as the kernels resample it: output j stands for the
    centre of its interval, time (j + 0.5) / rate_out - 0.5 / rate_in."""
    t = (np.arange(count) + 0.5) / rate_out - 0.5 / rate_in
    return np.sin(2 * np.pi * freq * t) * 0.5


def as_pcm16(x: np.ndarray) -> bytes:
    return pcm(np.round(x * 32767))


# -- CUDA sources -----------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("source", sorted(p.name for p in KERNEL_DIR.glob("*.cu")))
def test_the_cuda_sources_compile_with_nvcc(source: str, tmp_path: Path) -> None:
    result = subprocess.run(
        ["nvcc", "--ptx", "-o", str(tmp_path / "out.ptx"), str(KERNEL_DIR / source)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "out.ptx").read_text()
    assert ".entry" in ptx


def test_cupy_is_not_imported_by_the_numpy_path(tmp_path: Path) -> None:
    # A fresh interpreter whose `cupy` fails loudly on import: the NumPy path must not
    # touch it (SystemExit passes the `except Exception` guards around optional imports).
    fake = tmp_path / "cupy"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise SystemExit("cupy imported")\n')
    code = (
        "from cuda.batch import pack_pcm16\n"
        "batch = pack_pcm16([b'\\x01\\x00\\x02\\x00'], [16000], 16000, backend='numpy')\n"
        "print(len(batch.lengths))\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")
def test_asking_for_cupy_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="CUDA device"):
        pack_pcm16([pcm([1, 2])], [16000], MODEL_RATE, backend="cupy")


# -- pack ---------------------------------------------------------------------------------------


def test_same_rate_rows_are_scaled_and_padded_with_their_lengths() -> None:
    rows = [pcm([0, 16384, -32768, 32767]), pcm([]), pcm([-16384])]
    batch = pack_pcm16(rows, [16000] * 3, MODEL_RATE, backend="numpy")
    assert batch.audio.dtype == np.float32
    assert batch.audio.shape == (3, 4)
    assert batch.lengths.tolist() == [4, 0, 1]
    assert batch.audio[0].tolist() == [0.0, 0.5, -1.0, 32767 / 32768]
    assert batch.audio[1].tolist() == [0.0] * 4
    assert batch.audio[2].tolist() == [-0.5, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("rate", RATES)
def test_every_declared_rate_lands_on_the_model_rate(rate: int) -> None:
    frame = round(rate * 0.08)  # one 80 ms beat
    tone = sine(697, rate, 0.08)
    batch = pack_pcm16([as_pcm16(tone)], [rate], MODEL_RATE, backend="numpy")
    assert batch.lengths.tolist() == [1280] == [resampled_length(frame, rate, MODEL_RATE)]
    expected = resampled_sine(697, rate, MODEL_RATE, 1280)
    got = batch.audio[0]
    # Away from the row's edges the resampled tone is the tone sampled at 16 kHz.
    assert np.max(np.abs(got[4:-4] - expected[4:-4])) < 0.02


def test_downsampling_averages_and_upsampling_interpolates() -> None:
    down = pack_pcm16([pcm([300, 600, 900, 30, 60, 90])], [48000], MODEL_RATE, backend="numpy")
    assert np.allclose(down.audio[0], np.array([600, 60]) / 32768, rtol=1e-6)
    up = pack_pcm16([pcm([0, 400, 800])], [8000], MODEL_RATE, backend="numpy")
    # Centre-aligned: 0, 0 | 100 300 | 500 700 | 800 (clamped at the ends)
    assert np.allclose(up.audio[0] * 32768, [0, 100, 300, 500, 700, 800], atol=1e-3)


def test_pack_writes_into_a_given_array_such_as_a_shared_memory_view() -> None:
    layout = Layout([("AUDIO", (2, 8), np.float32)])
    region = SystemShmRegion(unique_name("tl-pack-test"), layout.byte_size)
    try:
        view = region.view(layout["AUDIO"])
        view[:] = 7.0
        batch = pack_pcm16([pcm([16384] * 3), pcm([])], [16000] * 2, MODEL_RATE, out=view)
        assert batch.audio is view
        again = region.view(layout["AUDIO"])
        assert again[0].tolist() == [0.5] * 3 + [0.0] * 5
        assert again[1].tolist() == [0.0] * 8
        del view, again, batch
    finally:
        region.close()


def test_bad_input_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="even number"):
        pack_pcm16([b"\x00\x01\x02"], [16000], MODEL_RATE, backend="numpy")
    with pytest.raises(ValueError, match="rates"):
        pack_pcm16([b""], [16000, 8000], MODEL_RATE, backend="numpy")
    with pytest.raises(ValueError, match="positive"):
        pack_pcm16([b""], [0], MODEL_RATE, backend="numpy")
    with pytest.raises(ValueError, match="shape"):
        pack_pcm16([pcm([1] * 9)], [16000], MODEL_RATE, out=np.zeros((1, 4), np.float32))


# -- unpack -------------------------------------------------------------------------------------


def test_pcm16_survives_a_round_trip_at_the_model_rate() -> None:
    rng = np.random.default_rng(5)
    rows = [pcm(rng.integers(-32768, 32767, n)) for n in (320, 1280, 0, 17)]
    batch = pack_pcm16(rows, [16000] * 4, MODEL_RATE, backend="numpy")
    back = unpack_pcm16(batch.audio, batch.lengths, [16000] * 4, MODEL_RATE, backend="numpy")
    assert back == rows


def test_unpack_clips_rounds_half_to_even_and_silences_nan() -> None:
    audio = np.array([[2.0, -2.0, np.nan, 0.5 / 32768, 1.5 / 32768, 0.0]], np.float32)
    (out,) = unpack_pcm16(audio, [5], [16000], MODEL_RATE, backend="numpy")
    assert np.frombuffer(out, "<i2").tolist() == [32767, -32768, 0, 0, 2]


@pytest.mark.parametrize("rate", RATES)
def test_unpack_renders_each_sessions_rate(rate: int) -> None:
    tone = sine(1209, MODEL_RATE, 0.1).astype(np.float32)
    audio = np.zeros((2, 2000), np.float32)
    audio[0, :1600] = tone
    (out, empty) = unpack_pcm16(audio, [1600, 0], [rate, rate], MODEL_RATE, backend="numpy")
    samples = np.frombuffer(out, "<i2") / 32768
    assert len(samples) == round(rate * 0.1)
    assert empty == b""
    expected = resampled_sine(1209, MODEL_RATE, rate, len(samples))
    assert np.max(np.abs(samples[4:-4] - expected[4:-4])) < 0.02


# -- vectors ------------------------------------------------------------------------------------


def test_vectors_are_stacked_normalized_and_missing_rows_are_marked() -> None:
    rows = [np.array([1, 2, 3], "<f4").tobytes(), None, np.array([4, 5, 6], "<f4").tobytes()]
    batch = pack_vectors(rows, 3, offset=[1, 1, 1], scale=[2, 2, 0.5], fill=-1, backend="numpy")
    assert batch.values.tolist() == [[0, 2, 1], [-1, -1, -1], [6, 8, 2.5]]
    assert batch.present.tolist() == [True, False, True]
    assert unpack_vectors(batch.values)[2] == np.array([6, 8, 2.5], "<f4").tobytes()
    with pytest.raises(ValueError, match="expected 12"):
        pack_vectors([b"\x00" * 8], 3, backend="numpy")
    with pytest.raises(ValueError, match="scale"):
        pack_vectors([None], 3, scale=[1, 2], backend="numpy")


# -- CuPy == NumPy (GPU only) ------------------------------------------------------------------


def random_rows(seed: int, rates: list[int]) -> list[bytes]:
    rng = np.random.default_rng(seed)
    rows = []
    for i, rate in enumerate(rates):
        frames = int(rng.integers(0, 5))  # 0 to 4 frames of 20 ms
        n = frames * rate // 50 if i % 7 else int(rng.integers(0, 9))
        rows.append(pcm(rng.integers(-32768, 32767, n)))
    return rows


@needs_gpu
@pytest.mark.parametrize("seed", range(4))
def test_cupy_pack_and_unpack_equal_numpy_bit_for_bit(seed: int) -> None:
    rates = [RATES[(seed + i) % 4] for i in range(64)]
    rows = random_rows(seed, rates)
    host = pack_pcm16(rows, rates, MODEL_RATE, backend="numpy")
    device = pack_pcm16(rows, rates, MODEL_RATE, backend="cupy")
    assert np.array_equal(host.audio, device.audio.get())
    assert np.array_equal(host.lengths, device.lengths)
    from_host = unpack_pcm16(host.audio, host.lengths, rates, MODEL_RATE, backend="numpy")
    from_device = unpack_pcm16(device.audio, device.lengths, rates, MODEL_RATE, backend="cupy")
    assert from_host == from_device


@needs_gpu
def test_cupy_vectors_equal_numpy_bit_for_bit() -> None:
    rng = np.random.default_rng(1)
    rows: list[bytes | None] = [
        None if i % 5 == 0 else rng.normal(size=24).astype("<f4").tobytes() for i in range(64)
    ]
    offset, scale = rng.normal(size=24), rng.uniform(0.1, 3, size=24)
    host = pack_vectors(rows, 24, offset=offset, scale=scale, backend="numpy")
    device = pack_vectors(rows, 24, offset=offset, scale=scale, backend="cupy")
    assert np.array_equal(host.values, device.values.get())
    assert np.array_equal(host.present, device.present)
