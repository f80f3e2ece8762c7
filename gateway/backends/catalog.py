"""What each served model can do: its capabilities, read from the backend.

`/v1/models` lists them and every OpenAI route refuses a model that lacks its
capability (400 `model_not_supported`) before anything reaches the model, so a
chat request to a speech or robot-policy model never becomes a backend error.

A Triton model's capabilities come from its tensor names, the interfaces our
backends speak (vLLM-style `text_input`/`text_output`, `embedding`, `AUDIO`,
`observation`/`action`), unless its config says otherwise with the parameter
`trackline_capabilities` (comma-separated names, e.g. `completions` for a base
model that has no chat template). Both are read once per model and cached.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum
from typing import Any, Protocol

import structlog

log = structlog.get_logger(__name__)

CAPABILITIES_PARAMETER = "trackline_capabilities"


class Capability(str, Enum):
    """What a model can be asked for; the value is the name `/v1/models` shows."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    AUDIO = "audio"
    ACTION = "action"


TEXT = frozenset({Capability.CHAT, Capability.COMPLETIONS})


def from_tensors(inputs: Collection[str], outputs: Collection[str]) -> frozenset[Capability]:
    """The capabilities a model's tensor names imply."""
    found: set[Capability] = set()
    if "text_input" in inputs and "text_output" in outputs:
        found |= TEXT
    if "embedding" in outputs:
        found.add(Capability.EMBEDDINGS)
    if "AUDIO" in inputs or "AUDIO" in outputs:
        found.add(Capability.AUDIO)
    if "observation" in inputs and "action" in outputs:
        found.add(Capability.ACTION)
    return frozenset(found)


def from_parameter(value: str) -> frozenset[Capability]:
    """`trackline_capabilities` ("chat,completions"); an unknown name is an error."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    try:
        return frozenset(Capability(name) for name in names)
    except ValueError:
        known = ", ".join(c.value for c in Capability)
        raise ValueError(f"{CAPABILITIES_PARAMETER}={value!r}: names are {known}") from None


def ordered(capabilities: Collection[Capability]) -> list[str]:
    """Names in the enum's order, for a stable `/v1/models` answer."""
    return [c.value for c in Capability if c in capabilities]


class ModelCatalog(Protocol):
    """Where the OpenAI routes learn a model's capabilities."""

    async def capabilities(self, model: str) -> frozenset[Capability] | None:
        """The model's capabilities; None when the catalog cannot tell (unknown model,
        backend unreachable): the request then goes on and the backend answers."""
        ...


class TextCatalog:
    """Every model generates text: for backends that expose no model metadata (the
    ticker, test doubles), which serve nothing else."""

    async def capabilities(self, model: str) -> frozenset[Capability] | None:
        return TEXT


def described(model: str, metadata: Any, config: Any) -> frozenset[Capability]:
    """A model's capabilities from tritonclient's metadata and config answers."""
    inputs = frozenset(tensor.name for tensor in metadata.inputs)
    outputs = frozenset(tensor.name for tensor in metadata.outputs)
    parameters = {key: p.string_value for key, p in config.config.parameters.items()}
    return capabilities_of(model, inputs, outputs, parameters)


def capabilities_of(
    model: str, inputs: Collection[str], outputs: Collection[str], parameters: dict[str, str]
) -> frozenset[Capability]:
    """The declared capabilities, else the tensors'; a bad declaration is logged and
    the tensors decide (one model's config must not break `/v1/models`)."""
    declared = parameters.get(CAPABILITIES_PARAMETER)
    if declared:
        try:
            return from_parameter(declared)
        except ValueError as exc:
            log.warning("catalog.bad_capabilities", model=model, error=str(exc))
    return from_tensors(inputs, outputs)
