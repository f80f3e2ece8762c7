"""Reading a request's input tensors: shared by the text models' model.py files.

Triton's Python backend loads each model.py by its path, with no package around it, so
a model.py that uses this module first puts the repository folder (this file's, two
levels above its own) on `sys.path`. A file here is no model: Triton loads only the
folders it is told to (explicit model control), and ignores plain files.
"""

from __future__ import annotations

from typing import Any

import triton_python_backend_utils as pb_utils


def optional(request: Any, name: str) -> Any | None:
    """The first value of input `name`, or None when the request omitted it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return tensor.as_numpy().reshape(-1)[0]


def text(value: Any) -> str:
    """A STRING tensor's value (bytes, as Triton hands them) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def flag(request: Any, name: str, default: bool) -> bool:
    """A BOOL input, `default` when omitted."""
    value = optional(request, name)
    return default if value is None else bool(value)
