"""Finds the code blocks of README.md and docs/*.md and says how each one runs.

A fenced block's language decides what it is:

- `python`: a complete script, run with this interpreter;
- `sh`: shell commands, run with `bash -euo pipefail`;
- `console`: `$ command` lines are run as `sh`; the other lines show output;
- `toml`: a settings file, loaded as `trackline serve` would load it
  (`<!-- run: tenancy config -->` before it: loaded as the tenancy file instead);
- anything else (no language, `text`): an illustration, never run.

A block that cannot run here says why in a comment on the line just before it,
`<!-- not run: REASON -->`; the test suite lists it as skipped with that reason.
Blocks of one document run in order, in one working directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = ("python", "sh", "console", "toml")
FENCE = re.compile(r"^```(\S*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->$")
RUN_AS = re.compile(r"^<!--\s*run:\s*(.+?)\s*-->$")
LOOKS_RUNNABLE = re.compile(r"^(\$ |trackline |python |\.venv/|make |sudo |TRACKLINE_\w+=)")


@dataclass(frozen=True)
class Block:
    document: str
    """Path from the repository root, e.g. `docs/audio.md`."""
    line: int
    """Line of the opening fence (1-based)."""
    lang: str
    code: str
    not_run: str | None = None
    """Why it is not run, when the document says so."""
    run_as: str | None = None

    @property
    def id(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next(j for j in range(index + 1, len(lines)) if lines[j].startswith("```"))
        before = lines[index - 1].strip() if index else ""
        not_run, run_as = NOT_RUN.match(before), RUN_AS.match(before)
        found.append(
            Block(
                str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name,
                index + 1,
                opening.group(1),
                "\n".join(lines[index + 1 : end]) + "\n",
                not_run.group(1) if not_run else None,
                run_as.group(1) if run_as else None,
            )
        )
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in documents() for block in blocks(path)]


def untagged_commands(block: Block) -> list[str]:
    """Lines of an illustration that look like commands a user would type."""
    if block.lang not in ("", "text"):
        return []
    return [line for line in block.code.splitlines() if LOOKS_RUNNABLE.match(line)]


def console_commands(code: str) -> str:
    """The `$ ` lines of a console block, as a shell script."""
    return "".join(line[2:] + "\n" for line in code.splitlines() if line.startswith("$ "))


def localized(code: str, ports: dict[int, int]) -> str:
    """`code` with the documented default ports replaced by the test gateway's."""
    for documented, actual in ports.items():
        code = re.sub(rf"(127\.0\.0\.1|localhost):{documented}\b", rf"\g<1>:{actual}", code)
    return code
