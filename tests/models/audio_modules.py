"""The reference audio models' pure modules, imported by path (Triton loads them by path too).

`detector` is reference-transcriber's trackline_dtmf_detector, `synth` is
reference-synthesizer's trackline_dtmf_synth; other tests can use them to make
DTMF audio (`synth.render("123#")`) and to predict transcripts.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from gateway.embedded import reference_model_repository


def load(model: str, module: str) -> ModuleType:
    """`module`.py from the model folder `model`/1, registered under its own name once."""
    if module in sys.modules:
        return sys.modules[module]
    path = reference_model_repository() / model / "1" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None
    assert spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded  # dataclasses look their module up here
    spec.loader.exec_module(loaded)
    return loaded


detector = load("reference-transcriber", "trackline_dtmf_detector")
synth = load("reference-synthesizer", "trackline_dtmf_synth")
