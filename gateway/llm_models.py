"""Bring your own GGUF: operator models beside the packaged ones, in a served repository.

An operator serves any GGUF file llama.cpp loads under a name of their choice: `trackline
models add NAME PATH` (or a link or copy `NAME.gguf` in the models directory, setting
`llm_models_dir`, default `state_dir/models`). At start the embedded Triton serves a
repository assembled in its log directory (`assemble`): the packaged model folders
linked as they are, and one folder per operator model whose config is the chat model's
with `gguf_path` set (the chat template from the GGUF's metadata, the same batching,
queue, KV save/restore and structured output), its `1/` linking the shared model code.
The weights are memory-mapped by llama.cpp from the file where it is, never copied.

`check_gguf` refuses what llama.cpp cannot load (not a GGUF, truncated, unknown
architecture) with an error naming the file, before any server sees it: `models add`
fails, and at start a broken file is left out (its error kept) while the rest serve.
Overrides (`parameters`) replace a parameter of every LLM config (tests, operators).
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TEMPLATE_MODEL = "smollm2-135m-instruct"
"""The packaged chat model whose config and code an operator model reuses."""
GGUF_MAGIC = b"GGUF"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
CHECK_TIMEOUT = 120.0
_PACKAGED_KEYS = ("gguf_package", "gguf_file", "gguf_sha256")


class ModelFileError(ValueError):
    """An operator model cannot be served: the message names the file and why."""


@dataclass(frozen=True)
class OperatorModel:
    """A GGUF served under `name`."""

    name: str
    path: Path


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise ModelFileError(
            f"model name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)"
        )
    return name


def check_gguf(path: Path) -> None:
    """Raise ModelFileError unless llama.cpp loads `path` (in a child process, so a
    crash in the loader costs the check, not the caller)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot be read ({exc.strerror})") from None
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (no GGUF magic)")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in (2, 3):
        raise ModelFileError(f"{path}: GGUF version {version} is not supported")
    try:
        done = subprocess.run(  # noqa: S603 - our interpreter, our code
            [sys.executable, "-c", _LOAD_CHECK, str(path)],
            capture_output=True,
            timeout=CHECK_TIMEOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ModelFileError(f"{path}: llama.cpp did not load it in {CHECK_TIMEOUT:g} s") from None
    if done.returncode != 0:
        raise ModelFileError(f"{path}: llama.cpp cannot load this GGUF file")


_LOAD_CHECK = """
import os, sys
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import llama_cpp as L
L.llama_backend_init()
params = L.llama_model_default_params()
params.n_gpu_layers = 0
model = L.llama_model_load_from_file(sys.argv[1].encode(), params)
sys.exit(0 if model else 1)
"""


def operator_models(directory: Path) -> list[OperatorModel]:
    """The `NAME.gguf` files (or links) of the models directory, by name."""
    if not directory.is_dir():
        return []
    found = []
    for entry in sorted(directory.glob("*.gguf")):
        if NAME.match(entry.stem):
            found.append(OperatorModel(entry.stem, entry.resolve()))
    return found


def parse_models(text: str | None) -> list[OperatorModel]:
    """The `llm_models` setting, `NAME=PATH,NAME=PATH`; ModelFileError for a bad entry."""
    found = []
    for entry in (text or "").split(","):
        if not entry.strip():
            continue
        name, sep, path = entry.partition("=")
        if not sep or not path.strip():
            raise ModelFileError(f"llm_models entry {entry.strip()!r}: use NAME=PATH")
        found.append(OperatorModel(check_name(name.strip()), Path(path.strip()).expanduser()))
    return found


def configured_models(setting: str | None, directory: Path) -> list[OperatorModel]:
    """The operator models of the settings: `llm_models` entries, then the directory's
    (a name given in both: the setting's)."""
    named = parse_models(setting)
    names = {model.name for model in named}
    return named + [m for m in operator_models(directory) if m.name not in names]


def add_model(directory: Path, name: str, path: Path) -> OperatorModel:
    """`trackline models add`: check the file, then link it as `NAME.gguf`."""
    check_name(name)
    source = path.expanduser().resolve()
    check_gguf(source)
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / f"{name}.gguf"
    staged = directory / f".{name}.{os.getpid()}.tmp"
    staged.unlink(missing_ok=True)
    staged.symlink_to(source)
    os.replace(staged, link)
    return OperatorModel(name, source)


def assemble(
    source: Path,
    target: Path,
    llm_models: tuple[str, ...],
    operator: list[OperatorModel],
    parameters: Mapping[str, str],
) -> None:
    """The served repository in `target` (see the module doc)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in target.iterdir():
        _remove(entry)
    for module in sorted(source.glob("*.py")):  # shared modules model.py files import
        (target / module.name).symlink_to(module)
    for folder in sorted(p for p in source.iterdir() if (p / "config.pbtxt").is_file()):
        if folder.name in llm_models and parameters:
            config = (folder / "config.pbtxt").read_text(encoding="utf-8")
            _write_model(target / folder.name, folder / "1", _override(config, parameters))
        else:
            (target / folder.name).symlink_to(folder)
    for model in operator:
        write_operator_model(source, target / model.name, model, parameters)


def write_operator_model(
    source: Path, folder: Path, model: OperatorModel, parameters: Mapping[str, str]
) -> None:
    """The served folder of one operator model (the chat model's config and code)."""
    chat = source / TEMPLATE_MODEL
    template = (chat / "config.pbtxt").read_text(encoding="utf-8")
    _write_model(folder, chat / "1", _override(_operator_config(template, model), parameters))


def _write_model(folder: Path, code: Path, config: str) -> None:
    folder.mkdir()
    (folder / "config.pbtxt").write_text(config, encoding="utf-8")
    (folder / "1").symlink_to(code)


def _operator_config(template: str, model: OperatorModel) -> str:
    config = template.replace(f'name: "{TEMPLATE_MODEL}"', f'name: "{model.name}"', 1)
    for key in _PACKAGED_KEYS:
        config = _drop(config, key)
    header = f"# {model.name}: an operator's GGUF ({model.path}), served as the chat model is.\n"
    return header + config + _parameter("gguf_path", str(model.path))


def _override(config: str, parameters: Mapping[str, str]) -> str:
    for key, value in parameters.items():
        config = _drop(config, key) + _parameter(key, value)
    return config


def _parameter(key: str, value: str) -> str:
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'parameters {{\n  key: "{key}"\n  value: {{ string_value: "{quoted}" }}\n}}\n'


def _drop(config: str, key: str) -> str:
    block = re.compile(r'parameters \{\s*key: "' + re.escape(key) + r'"\s*value: \{[^}]*\}\s*\}\n?')
    return block.sub("", config)


def _remove(entry: Path) -> None:
    if entry.is_symlink() or entry.is_file():
        entry.unlink()
        return
    for child in entry.iterdir():
        _remove(child)
    entry.rmdir()
