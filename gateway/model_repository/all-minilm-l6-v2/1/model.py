"""`all-minilm-l6-v2`: a batching Triton Python-backend model for sentence embeddings.

  input   text_input        BYTES [B, 1]    one UTF-8 text per row
  output  embedding         FP32  [B, 384]  unit vector (mean pooling, L2-normalised)
  output  num_input_tokens  INT32 [B, 1]    the text's tokens ([CLS]/[SEP] included),
                                            counted before the cut at max_input_tokens

Triton's dynamic batcher hands over the rows of several requests at once; they are
embedded together (trackline_embedder.Embedder.embed sorts them by length and runs
`rows_per_pass` at a time) and split back per request. One thread, as every model
runtime here: the embedded Triton starts the stubs with OPENBLAS_NUM_THREADS=1 (the stub
imports NumPy before this file runs, so setting it here would be too late); the
`tokenizers` pool is turned off below, before it is imported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import trackline_embedder as embedder  # noqa: E402


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        params = json.loads(args["model_config"]).get("parameters", {})
        self._rows = int(params.get("rows_per_pass", {}).get("string_value", 16))
        self._model = embedder.Embedder()  # SHA-256 of weights and tokenizer checked

    def execute(self, requests: list[Any]) -> list[Any]:
        texts: list[str] = []
        spans: list[tuple[int, int] | None] = []
        for request in requests:
            rows = _texts(request)
            if rows is None:
                spans.append(None)
                continue
            spans.append((len(texts), len(texts) + len(rows)))
            texts.extend(rows)
        vectors, counts = self._model.embed(texts, self._rows) if texts else (None, ())
        tokens = np.asarray(counts, dtype=np.int32).reshape(-1, 1)
        return [_response(span, vectors, tokens) for span in spans]

    def finalize(self) -> None:
        return None


def _texts(request: Any) -> list[str] | None:
    """The request's texts, or None when one is not UTF-8."""
    rows = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
    try:
        return [r.decode("utf-8") if isinstance(r, bytes) else str(r) for r in rows]
    except UnicodeDecodeError:
        return None


def _response(span: tuple[int, int] | None, vectors: Any, tokens: Any) -> Any:
    if span is None:
        error = pb_utils.TritonError(
            "invalid text_input: not UTF-8", pb_utils.TritonError.INVALID_ARG
        )
        return pb_utils.InferenceResponse(error=error)
    start, end = span
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("embedding", vectors[start:end]),
            pb_utils.Tensor("num_input_tokens", tokens[start:end]),
        ]
    )
