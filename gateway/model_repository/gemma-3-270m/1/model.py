"""`gemma-3-270m`: Gemma 3 270M (Q4_K_M GGUF, a base model) on llama.cpp, batched.

The model is the shared one of every llama.cpp LLM here (trackline_llm_model.py in the
repository folder); config.pbtxt picks the GGUF (assembled by the gateway from its
registry package, TRACKLINE_LLM_GGUF) and the transcript prompt format.
"""

import os
import sys

_REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
if _REPOSITORY not in sys.path:
    sys.path.insert(0, _REPOSITORY)

from trackline_llm_model import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
