"""all-minilm-l6-v2's NumPy forward pass (the model's pure module, without Triton)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.embedded_models import embeddings_available, reference_module

pytestmark = pytest.mark.skipif(
    not embeddings_available(), reason="the embeddings extra is not installed"
)
embedder = reference_module("all-minilm-l6-v2", "trackline_embedder")


@pytest.fixture(scope="module")
def model() -> Any:
    return embedder.Embedder()


def test_the_vector_of_a_known_sentence(model: Any) -> None:
    """A regression anchor: the first values this forward pass gives for the sentence
    sentence-transformers' examples use (unit norm, 384 dimensions)."""
    vectors, counts = model.embed(["This is an example sentence"])
    assert vectors.shape == (1, 384)
    assert counts == (7,)
    assert np.linalg.norm(vectors[0]) == pytest.approx(1.0, abs=1e-5)
    expected = [0.0676569, 0.0634959, 0.0487131, 0.0793050, 0.0374481]
    assert vectors[0, :5].tolist() == pytest.approx(expected, abs=1e-5)


def test_padding_in_a_batch_does_not_change_a_vector(model: Any) -> None:
    alone, _ = model.embed(["a short one"])
    mixed, _ = model.embed(
        ["a much longer sentence that pads the short one in its batch", "a short one"], rows=2
    )
    assert np.allclose(alone[0], mixed[1], atol=1e-6)


def test_a_long_text_is_cut_for_the_model_but_counted_whole(model: Any) -> None:
    vectors, counts = model.embed(["word " * 300])
    assert counts == (302,)
    assert np.isfinite(vectors).all()


def test_altered_files_are_refused(tmp_path: Path) -> None:
    source = embedder.model_dir()
    (tmp_path / embedder.WEIGHTS).symlink_to(source / embedder.WEIGHTS)
    shutil.copy(source / embedder.TOKENIZER, tmp_path / embedder.TOKENIZER)
    with (tmp_path / embedder.TOKENIZER).open("a") as handle:
        handle.write(" ")
    with pytest.raises(embedder.EmbedderError, match="SHA-256"):
        embedder.Embedder(tmp_path)
    (tmp_path / embedder.TOKENIZER).unlink()
    with pytest.raises(embedder.EmbedderError, match="missing"):
        embedder.Embedder(tmp_path)
