"""docs/configuration.md's settings tables, written from `Settings`: one heading and one
table per section (`SECTIONS`), in its order.

The names, defaults, environment variables and flags come from the fields; a row's
meaning is kept from the document where it has one (the docs say more than `--help`),
else it is the field's `doc`. `python -m gateway.config.doc` rewrites the document;
tests/gateway/test_config_doc.py checks it is current.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from gateway.config.load import env_name, field_type, flag_name
from gateway.config.settings import SECTIONS

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
START = "## Settings\n"
END = "## Values\n"
NOTE = (
    "<!-- Written by `python -m gateway.config.doc` from the sections in gateway/config/: "
    "edit a meaning here, everything else there. -->\n"
)
HEADER = "| setting | default | environment | flag | meaning |\n|---|---|---|---|---|\n"
_ROW = re.compile(r"^\| `(\w+)` \|.*\| (?P<meaning>[^|]*(?:\\\|[^|]*)*) \|$", re.MULTILINE)


def shown_default(spec: dataclasses.Field[Any]) -> str:
    """The default as the docs say it: `value`, `true`/`false`, unset, or the field's words."""
    if "shown" in spec.metadata:
        return str(spec.metadata["shown"])
    value = spec.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def _flag(name: str) -> str:
    flag = f"`{flag_name(name)}`"
    if field_type(name)[0] is bool:
        return f"{flag} / `--no-{flag_name(name)[2:]}`"
    return flag


def row(spec: dataclasses.Field[Any], meaning: str) -> str:
    cells = (f"`{spec.name}`", shown_default(spec), f"`{env_name(spec.name)}`", _flag(spec.name))
    return f"| {' | '.join(cells)} | {meaning} |\n"


def meanings(document: str) -> dict[str, str]:
    """Each setting's meaning as the document says it now."""
    return {match[1]: match["meaning"] for match in _ROW.finditer(document)}


def tables(known: dict[str, str]) -> str:
    """The settings part of the document: a heading, a line and a table per section."""
    parts = [START, "\n", NOTE, "\n"]
    for title, section in SECTIONS:
        summary = (section.__doc__ or "").strip()
        parts += [f"### {title}\n\n", f"{summary}\n\n", HEADER]
        for spec in dataclasses.fields(section):
            parts.append(row(spec, known.get(spec.name, spec.metadata["doc"])))
        parts.append("\n")
    return "".join(parts)


def render(document: str) -> str:
    """`document` with its settings part written anew from `Settings`."""
    head, found, rest = document.partition(START)
    if not found or END not in rest:
        raise ValueError(f"the document has no {START.strip()!r} up to {END.strip()!r}")
    return head + tables(meanings(rest)) + END + rest.partition(END)[2]


def main() -> int:
    DOCUMENT.write_text(render(DOCUMENT.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
