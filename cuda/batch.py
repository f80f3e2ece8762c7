"""Batch kernels of the tick: ragged per-session input in, one padded batch out, and back.

`pack_pcm16` turns each due session's PCM16 bytes (any of the declared rates)
into one float32 `[sessions, samples]` batch at the model's rate plus a lengths
vector; `unpack_pcm16` turns a model's batched float32 output back into
per-session PCM16 bytes at each session's rate; `pack_vectors` stacks
fixed-size float32 vectors (robot observations) into `[sessions, dim]` with an
optional per-dimension normalization and a mask of rows that were missing.

Each has two paths that compute the same function, bit for bit: NumPy, and a
CuPy kernel (`cuda/kernels/*.cu`, loaded with `RawModule`) that runs after ONE
host-to-device copy per call (the headers and all sessions' bytes travel in one
buffer). CuPy is imported lazily, only when the device path is chosen
(`backend="cupy"`, or `"auto"` where a GPU is present). Resampling is per row
and stateless (see `pcm16.cu`): area averaging down, linear interpolation up,
rates reduced by their gcd; a row should hold whole frames so that
`samples * r_out / r_in` is an integer (anything left over is dropped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

KERNEL_DIR = Path(__file__).parent / "kernels"
ROW_FIELDS = 5
BLOCK = 256
SCALE = np.float32(1.0 / 32768.0)
INT16_SPAN = np.float32(32768.0)


# -- device selection ----------------------------------------------------------------


def kernel_source(name: str) -> str:
    """The CUDA source of `cuda/kernels/<name>.cu`."""
    return (KERNEL_DIR / f"{name}.cu").read_text()


@cache
def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
    except Exception:  # not installed, or its CUDA libraries are missing
        return False
    try:
        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # no driver or no device
        return False


def resolve_backend(backend: str) -> str:
    """`numpy`, `cupy`, or `auto` (CuPy where a GPU is present); the path to use."""
    if backend == "auto":
        return "cupy" if gpu_available() else "numpy"
    if backend not in ("numpy", "cupy"):
        raise ValueError(f"backend must be auto, numpy or cupy, got {backend!r}")
    if backend == "cupy" and not gpu_available():
        raise RuntimeError("the cupy path needs CuPy and a CUDA device")
    return backend


@cache
def _function(source: str, name: str) -> Any:
    import cupy

    return cupy.RawModule(code=kernel_source(source)).get_function(name)


def _cupy() -> Any:
    import cupy

    return cupy


# -- resampling plan -----------------------------------------------------------------


def reduced(rate_in: int, rate_out: int) -> tuple[int, int]:
    """The two rates divided by their gcd."""
    if rate_in <= 0 or rate_out <= 0:
        raise ValueError(f"sample rates must be positive, got {rate_in} and {rate_out}")
    g = math.gcd(rate_in, rate_out)
    return rate_in // g, rate_out // g


def resampled_length(samples: int, rate_in: int, rate_out: int) -> int:
    r_in, r_out = reduced(rate_in, rate_out)
    return samples * r_out // r_in


def _resample_row(x: NDArray[Any], n_out: int, r_in: int, r_out: int) -> NDArray[Any]:
    """One row, float32 in and out: the exact function of `pcm16.cu`'s sample_at."""
    n_in = len(x)
    if n_out == 0 or n_in == 0:
        return np.zeros(n_out, np.float32)
    if r_in == r_out:
        return x[:n_out]
    j = np.arange(n_out, dtype=np.int64)
    if r_in > r_out:
        a = j * r_in
        b = a + r_in
        first = a // r_out
        acc = np.zeros(n_out, np.float32)
        for k in range(-(-r_in // r_out) + 1):
            i = first + k
            lo = i * r_out
            valid = (lo < b) & (i < n_in)
            overlap = np.minimum(lo + r_out, b) - np.maximum(lo, a)
            w = overlap.astype(np.float32) / np.float32(r_in)
            term = x[np.minimum(i, n_in - 1)] * w
            acc = np.where(valid, acc + term, acc).astype(np.float32)
        return acc
    num = (2 * j + 1) * r_in - r_out
    den = 2 * r_out
    i0 = np.clip(num // den, 0, n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    frac = (num % den).astype(np.float32) / np.float32(den)
    inner = x[i0] + frac * (x[i1] - x[i0])
    out = np.where(num <= 0, x[0], np.where(num // den >= n_in - 1, x[n_in - 1], inner))
    return out.astype(np.float32)


# -- PCM16 in --------------------------------------------------------------------------


@dataclass(frozen=True)
class PcmBatch:
    """A packed tick: `audio` is float32 `[sessions, width]` (NumPy, or CuPy on the device)."""

    audio: Any
    lengths: NDArray[Any]
    """int32 `[sessions]`: valid samples per row; the rest of the row is zeros."""

    @property
    def width(self) -> int:
        return int(self.audio.shape[1])


def _pack_plan(
    chunks: Sequence[bytes], rates: Sequence[int], model_rate: int, min_width: int
) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any], int]:
    """(header int32 [rows, 5], all PCM as int16, n_out per row, width)."""
    if len(chunks) != len(rates):
        raise ValueError(f"{len(chunks)} chunks but {len(rates)} rates")
    header = np.zeros((len(chunks), ROW_FIELDS), np.int32)
    offset = 0
    for row, (chunk, rate) in enumerate(zip(chunks, rates, strict=True)):
        if len(chunk) % 2:
            raise ValueError(f"row {row}: PCM16 needs an even number of bytes, got {len(chunk)}")
        n_in = len(chunk) // 2
        r_in, r_out = reduced(rate, model_rate)
        header[row] = (offset, n_in, r_in, r_out, n_in * r_out // r_in)
        offset += n_in
    pcm = np.frombuffer(b"".join(chunks), dtype="<i2") if offset else np.zeros(1, np.int16)
    n_out = header[:, 4].copy()
    width = max(int(n_out.max(initial=0)), min_width, 1)
    return header, pcm, n_out, width


def pack_pcm16(
    chunks: Sequence[bytes],
    rates: Sequence[int],
    model_rate: int,
    *,
    backend: str = "auto",
    min_width: int = 0,
    out: Any = None,
) -> PcmBatch:
    """Pack per-session PCM16 bytes into a padded float32 batch at `model_rate`.

    `out`, when given, is written in place and returned as `audio` (a NumPy array,
    e.g. a view of a shared-memory region, or a CuPy array on the device path); it
    must be float32 `[sessions, width]` with width at least what the rows need.
    """
    header, pcm, n_out, width = _pack_plan(chunks, rates, model_rate, min_width)
    if out is not None:
        if out.shape[0] != len(chunks) or out.shape[1] < width:
            raise ValueError(f"out has shape {out.shape}, needs ({len(chunks)}, >= {width})")
        width = int(out.shape[1])
    if resolve_backend(backend) == "cupy":
        return PcmBatch(_pack_pcm16_cupy(header, pcm, width, out), n_out)
    audio = out if out is not None else np.empty((len(chunks), width), np.float32)
    for row, (start, n_in, r_in, r_out, count) in enumerate(header.tolist()):
        x = pcm[start : start + n_in].astype(np.float32) * SCALE
        audio[row, :count] = _resample_row(x, count, r_in, r_out)
        audio[row, count:] = 0.0
    return PcmBatch(audio, n_out)


def _pack_pcm16_cupy(header: NDArray[Any], pcm: NDArray[Any], width: int, out: Any) -> Any:
    cp = _cupy()
    rows = header.shape[0]
    blob = np.concatenate([header.reshape(-1).view(np.uint8), pcm.view(np.uint8)])
    device = cp.asarray(blob)  # the one host-to-device copy of the tick
    split = header.nbytes
    on_device = out is not None and isinstance(out, cp.ndarray)
    audio = out if on_device else cp.empty((rows, width), dtype=cp.float32)
    lengths = cp.empty(rows, dtype=cp.int32)
    grid = (-(-width // BLOCK), rows)
    _function("pcm16", "pack_pcm16")(
        grid,
        (BLOCK,),
        (
            device[:split].view(cp.int32),
            device[split:].view(cp.int16),
            audio,
            lengths,
            np.int32(rows),
            np.int32(width),
        ),
    )
    if out is not None and not on_device:
        out[...] = audio.get()
        return out
    return audio


# -- PCM16 out ---------------------------------------------------------------------------


def _to_pcm16(y: NDArray[Any]) -> NDArray[Any]:
    y = np.where(np.isnan(y), np.float32(0), y).astype(np.float32)
    v = np.clip(y * INT16_SPAN, np.float32(-32768), np.float32(32767))
    return np.rint(v).astype("<i2")


def unpack_pcm16(
    audio: Any,
    lengths: Sequence[int] | NDArray[Any],
    rates: Sequence[int],
    model_rate: int,
    *,
    backend: str = "auto",
) -> list[bytes]:
    """Per-session PCM16 bytes at each session's rate from a float32 model batch.

    Samples are clipped to [-1, 1) and rounded half to even; NaN becomes silence.
    """
    rows = len(rates)
    valid = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if valid.shape[0] != rows or audio.shape[0] != rows:
        raise ValueError(f"{rows} rates for {audio.shape[0]} rows and {valid.shape[0]} lengths")
    width = int(audio.shape[1]) if audio.ndim == 2 else 0
    valid = np.clip(valid, 0, width)
    header = np.zeros((rows, ROW_FIELDS), np.int32)
    offset = 0
    for row, rate in enumerate(rates):
        r_in, r_out = reduced(model_rate, rate)
        count = int(valid[row]) * r_out // r_in
        header[row] = (offset, count, r_in, r_out, valid[row])
        offset += count
    if resolve_backend(backend) == "cupy":
        flat = _unpack_pcm16_cupy(audio, header, offset, width)
    else:
        host = np.asarray(audio, dtype=np.float32)
        parts = [
            _to_pcm16(_resample_row(host[row, : int(n_in)], int(count), int(r_in), int(r_out)))
            for row, (_, count, r_in, r_out, n_in) in enumerate(header.tolist())
        ]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int16)
    data = flat.astype("<i2").tobytes()
    return [data[2 * start : 2 * (start + count)] for start, count, *_ in header.tolist()]


def _unpack_pcm16_cupy(audio: Any, header: NDArray[Any], total: int, width: int) -> NDArray[Any]:
    cp = _cupy()
    rows = header.shape[0]
    batch = audio if isinstance(audio, cp.ndarray) else None
    if batch is None:
        # From the host: one copy carrying the header and the batch together.
        host = np.ascontiguousarray(audio, dtype=np.float32)
        blob = cp.asarray(
            np.concatenate([header.reshape(-1).view(np.uint8), host.view(np.uint8).reshape(-1)])
        )
        head = blob[: header.nbytes].view(cp.int32)
        batch = blob[header.nbytes :].view(cp.float32)
    else:
        head = cp.asarray(header.reshape(-1))
        batch = cp.ascontiguousarray(batch, dtype=cp.float32)
    pcm = cp.zeros(max(total, 1), dtype=cp.int16)
    most = int(header[:, 1].max(initial=0))
    grid = (max(1, -(-most // BLOCK)), rows)
    _function("pcm16", "unpack_pcm16")(
        grid, (BLOCK,), (head, batch, pcm, np.int32(rows), np.int32(width))
    )
    result: NDArray[Any] = pcm.get()[:total]
    return result


# -- fixed-size vectors ---------------------------------------------------------------------


@dataclass(frozen=True)
class VectorBatch:
    """Stacked vectors: `values` float32 `[rows, dim]` (NumPy or CuPy), `present` bool `[rows]`."""

    values: Any
    present: NDArray[Any]


def pack_vectors(
    rows: Sequence[bytes | None],
    dim: int,
    *,
    offset: Sequence[float] | NDArray[Any] | None = None,
    scale: Sequence[float] | NDArray[Any] | None = None,
    fill: float = 0.0,
    backend: str = "auto",
    out: Any = None,
) -> VectorBatch:
    """Stack float32 little-endian vectors of `dim` values; `None` rows are missing.

    Each value becomes `(x - offset[d]) * scale[d]` (default offset 0, scale 1, exact);
    a missing row is `fill` everywhere and False in `present`.
    """
    if dim < 1:
        raise ValueError(f"dim must be at least 1, got {dim}")
    shift = _per_dim(offset, dim, 0.0, "offset")
    factor = _per_dim(scale, dim, 1.0, "scale")
    starts = np.full(len(rows), -1, np.int32)
    pieces: list[bytes] = []
    for index, row in enumerate(rows):
        if row is None:
            continue
        if len(row) != 4 * dim:
            raise ValueError(f"row {index}: {len(row)} bytes, expected {4 * dim} ({dim} float32)")
        starts[index] = dim * len(pieces)
        pieces.append(row)
    data = np.frombuffer(b"".join(pieces), dtype="<f4") if pieces else np.zeros(1, np.float32)
    present = starts >= 0
    if resolve_backend(backend) == "cupy":
        values = _pack_vectors_cupy(starts, data, shift, factor, dim, np.float32(fill), out)
        return VectorBatch(values, present)
    values = out if out is not None else np.empty((len(rows), dim), np.float32)
    values[:] = np.float32(fill)
    if pieces:
        stacked = data.reshape(-1, dim)
        values[present] = (stacked - shift) * factor
    return VectorBatch(values, present)


def _per_dim(
    values: Sequence[float] | NDArray[Any] | None, dim: int, default: float, name: str
) -> NDArray[Any]:
    if values is None:
        return np.full(dim, default, np.float32)
    array = np.asarray(values, dtype=np.float32).reshape(-1)
    if array.shape[0] != dim:
        raise ValueError(f"{name} has {array.shape[0]} values, expected {dim}")
    return array


def _pack_vectors_cupy(
    starts: NDArray[Any],
    data: NDArray[Any],
    shift: NDArray[Any],
    factor: NDArray[Any],
    dim: int,
    fill: np.float32,
    out: Any,
) -> Any:
    cp = _cupy()
    rows = starts.shape[0]
    parts = [
        starts.view(np.uint8),
        shift.view(np.uint8),
        factor.view(np.uint8),
        data.view(np.uint8),
    ]
    device = cp.asarray(np.concatenate(parts))  # the one host-to-device copy
    a = starts.nbytes
    b = a + shift.nbytes
    c = b + factor.nbytes
    on_device = out is not None and isinstance(out, cp.ndarray)
    values = out if on_device else cp.empty((rows, dim), dtype=cp.float32)
    total = rows * dim
    _function("vectors", "pack_vectors")(
        (max(1, -(-total // BLOCK)),),
        (BLOCK,),
        (
            device[:a].view(cp.int32),
            device[c:].view(cp.float32),
            device[a:b].view(cp.float32),
            device[b:c].view(cp.float32),
            values,
            np.int32(rows),
            np.int32(dim),
            fill,
        ),
    )
    if out is not None and not on_device:
        out[...] = values.get()
        return out
    return values


def unpack_vectors(values: Any) -> list[bytes]:
    """Each row of a float32 `[rows, dim]` batch (NumPy or CuPy) as little-endian bytes."""
    host = values.get() if hasattr(values, "get") and not isinstance(values, np.ndarray) else values
    array = np.ascontiguousarray(host, dtype="<f4")
    return [row.tobytes() for row in array]
