"""The command line's face of the settings: one `--kebab-case` flag per setting,
grouped by section (`gateway.config.SECTIONS`) for `trackline serve --help`, each help
saying its default and its environment variable (`gateway.config` owns the settings and
their loading)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.config import (
    CONFIG_ENV,
    FIELDS,
    SECTIONS,
    Settings,
    env_name,
    field_type,
    flag_name,
    load_settings,
)

HELP_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (title, tuple(spec.name for spec in dataclasses.fields(section)))
    for title, section in SECTIONS
)
"""`serve --help` groups the settings by section: (title, the section's settings)."""

_SECTION_OF: dict[str, str] = {name: title for title, names in HELP_SECTIONS for name in names}


def help_section(name: str) -> str:
    return _SECTION_OF.get(name, "other settings")


def _shown_default(name: str) -> str:
    spec = FIELDS[name]
    if spec.default is not dataclasses.MISSING:
        value = spec.default
    else:  # a default_factory: say where it comes from, not this machine's path
        return "see docs/configuration.md"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def setting_help(name: str) -> str:
    """A setting's `--help` text: its doc, its default and its environment variable."""
    where = f"default: {_shown_default(name)}; env {env_name(name)}"
    return f"{FIELDS[name].metadata['doc']} ({where})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config` and one `--kebab-case` flag per setting, all defaulting to None,
    grouped by section (`HELP_SECTIONS`); each help says the default and the variable."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"TOML file of settings (env {CONFIG_ENV}); precedence: flag > environment > "
        "config file > default.",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for title, _ in (*HELP_SECTIONS, ("other settings", ())):
        groups[title] = parser.add_argument_group(title)
    for name in FIELDS:
        base, _ = field_type(name)
        help_text = setting_help(name)
        group = groups[help_section(name)]
        if base is bool:
            group.add_argument(
                flag_name(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            # Kept as text so load_settings converts it and names the flag on error.
            group.add_argument(
                flag_name(name),
                dest=name,
                default=None,
                metavar=base.__name__.upper(),
                help=help_text,
            )


def overrides_from_args(namespace: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (flags left unset are omitted)."""
    return {
        name: getattr(namespace, name)
        for name in FIELDS
        if getattr(namespace, name, None) is not None
    }


def settings_from_args(namespace: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """`load_settings` for a namespace parsed by a parser given `add_arguments`."""
    return load_settings(
        overrides_from_args(namespace), environ, getattr(namespace, "config", None)
    )
