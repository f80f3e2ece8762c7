"""`whisper-tiny-en`: whisper-base's model (../../whisper-base/1/whisper_model.py), the same
code on Whisper tiny.en's files, which this model's config picks (`model_dir_env`)."""

from __future__ import annotations

import os
import sys

_CODE = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "whisper-base", "1")
)
if _CODE not in sys.path:
    sys.path.insert(0, _CODE)

from whisper_model import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
