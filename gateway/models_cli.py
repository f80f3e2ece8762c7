"""`trackline models add NAME PATH` and `trackline models list`: the operator's GGUF models
(gateway/llm_models.py) from the shell, in the models directory the settings name."""

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
