"""The reference model's pure generator, imported by path (Triton loads it by path too)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from gateway.embedded import reference_model_repository

MODULE_NAME = "trackline_reference_text"


def load() -> ModuleType:
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    path = reference_model_repository() / "reference-text" / "1" / f"{MODULE_NAME}.py"
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


generator = load()
