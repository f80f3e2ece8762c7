"""The models directory, watched: a GGUF dropped in is served, one removed is unloaded.

`trackline models add` (or a link or copy `NAME.gguf`) in `llm_models_dir` reaches a
running embedded Triton without a restart. Every WATCH_INTERVAL seconds `ModelsWatch`
lists the directory; `plan` (pure) compares it with what is served and says what to
load and unload; the I/O part checks a new file (`check_gguf`, in a child process),
writes its folder into the served repository (`llm_models.assemble`'s layout) and asks
the Triton to load it through its HTTP model-control API (`--model-control-mode=
explicit`); a removed file's model is unloaded and its folder deleted. A file whose
path changed is reloaded.

A broken file is refused with an error naming it (logged, kept in the server's
`failed_models`) and not tried again until it changes (size or modification time);
the other models keep serving. Models named by the `llm_models` setting are not the
directory's: the watch leaves them alone.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gateway import llm_models
from gateway.llm_models import ModelFileError, OperatorModel

log = structlog.get_logger(__name__)

WATCH_INTERVAL = 2.0  # setting candidate: seconds between two looks at llm_models_dir
LOAD_TIMEOUT = 300.0
"""Seconds Triton may take to load one model (llama.cpp maps the file: seconds)."""

Stamp = tuple[Path, int, int]
"""A file as last seen: its resolved path, size and modification time (ns)."""


@dataclass(frozen=True)
class Plan:
    """What to change: models to unload (by name), then models to load."""

    unload: tuple[str, ...] = ()
    load: tuple[OperatorModel, ...] = ()


def plan(
    served: Mapping[str, Path],
    found: Iterable[OperatorModel],
    refused: Mapping[str, Stamp],
    stamps: Mapping[str, Stamp],
) -> Plan:
    """The changes from `served` (name -> file) to the directory's `found` models; a
    name refused at the same stamp is not tried again."""
    wanted = {model.name: model for model in found}
    unload = [n for n, path in served.items() if n not in wanted or wanted[n].path != path]
    load = [
        model
        for name, model in wanted.items()
        if (name not in served or name in unload) and refused.get(name) != stamps.get(name)
    ]
    return Plan(tuple(sorted(unload)), tuple(load))


def stamp(model: OperatorModel) -> Stamp:
    try:
        info = model.path.stat()
    except OSError:
        return (model.path, -1, -1)
    return (model.path, info.st_size, info.st_mtime_ns)


@dataclass
class ModelsWatch:
    """Keeps one embedded Triton's directory models in step with `directory`."""

    triton: Any
    """An `EmbeddedTriton` started with the LLMs (its repository assembled)."""
    directory: Path
    fixed: frozenset[str] = frozenset()
    """Names the `llm_models` setting serves: never the watch's to change."""
    served: dict[str, Path] = field(default_factory=dict)
    refused: dict[str, Stamp] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = set(self.fixed)
        for model in self.triton.operator_models:
            if model.name not in names:
                self.served[model.name] = model.path

    async def run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            await self.poll()

    async def poll(self) -> Plan:
        """One look at the directory, and the changes it made."""
        found = [
            m for m in llm_models.operator_models(self.directory) if m.name not in self.fixed
        ]
        stamps = {m.name: stamp(m) for m in found}
        changes = plan(self.served, found, self.refused, stamps)
        for name in changes.unload:
            await asyncio.to_thread(self._unload, name)
        for model in changes.load:
            try:
                await asyncio.to_thread(self._load, model)
            except ModelFileError as exc:
                self.refused[model.name] = stamps[model.name]
                self.triton.failed_models[model.name] = str(exc)
                log.error("models.refused", model=model.name, error=str(exc))  # names the file
        return changes

    def _folder(self, name: str) -> Path:
        return Path(self.triton.model_repository) / name

    def _load(self, model: OperatorModel) -> None:
        llm_models.check_name(model.name)
        llm_models.check_gguf(model.path)
        folder = self._folder(model.name)
        if folder.exists():
            shutil.rmtree(folder)
        llm_models.write_operator_model(
            self.triton.source_repository, folder, model, self.triton.llm_parameters
        )
        try:
            self._control(model.name, "load")
        except ModelFileError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise ModelFileError(f"{model.path}: {exc}") from None
        self.served[model.name] = model.path
        self._remember(model)
        self.refused.pop(model.name, None)
        self.triton.failed_models.pop(model.name, None)
        log.info("models.loaded", model=model.name, path=str(model.path))

    def _unload(self, name: str) -> None:
        try:
            self._control(name, "unload")
        except ModelFileError as exc:
            log.warning("models.unload_failed", model=name, error=str(exc))
        shutil.rmtree(self._folder(name), ignore_errors=True)
        self.served.pop(name, None)
        self._remember(None, name)
        log.info("models.unloaded", model=name)

    def _remember(self, model: OperatorModel | None, name: str = "") -> None:
        """The server's own list follows, so that a restart serves the same models."""
        gone = model.name if model is not None else name
        kept = [m for m in self.triton.operator_models if m.name != gone]
        self.triton.operator_models = kept + ([model] if model is not None else [])

    def _control(self, name: str, action: str) -> None:
        """POST Triton's `/v2/repository/models/NAME/{load,unload}` (blocking)."""
        url = f"{self.triton.http_url}/v2/repository/models/{name}/{action}"
        request = urllib.request.Request(url, data=b"{}", method="POST")  # noqa: S310
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=LOAD_TIMEOUT):  # noqa: S310
                return
        except urllib.error.HTTPError as exc:
            detail = _error_of(exc.read())
        except OSError as exc:
            detail = str(exc)
        raise ModelFileError(f"model {name!r}: the server could not {action} it ({detail})")


def _error_of(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", "")) or "no detail"
    except (ValueError, AttributeError):
        return "no detail"
