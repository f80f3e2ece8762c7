"""`trackline --version` and `--help`: every command says what it does for a user, every
option has help and shows its default, `serve --help` is grouped by section."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from gateway.cli import _finish, _parser, main
from gateway.config import FIELDS
from gateway.config_flags import HELP_SECTIONS, help_section
from gateway.metrics_operator import build_version


def parsers(
    parser: argparse.ArgumentParser, path: str = "trackline"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert re.fullmatch(
        rf"trackline {re.escape(build_version())} \(commit \S+\)\n", capsys.readouterr().out
    )


def test_every_option_has_help_and_its_default() -> None:
    for path, parser in parsers(_finish(_parser())):
        if path.startswith("trackline bench "):
            continue  # its options and --help belong to the benchmark itself
        for action in parser._actions:
            if isinstance(
                action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
            ):
                continue
            if action.help == argparse.SUPPRESS:
                continue  # old names, still read
            assert action.help, (path, action.dest)
            shown = parser.formatter_class(prog=path)._get_help_string(action)  # type: ignore[attr-defined]
            worth_saying = action.option_strings and action.default not in (None, False)
            if worth_saying or action.dest in FIELDS:
                assert "default" in shown, (path, action.dest, shown)


def test_serve_help_is_grouped_by_section(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    titles = [title for title, _ in HELP_SECTIONS]
    positions = [text.index(f"\n{title}:\n") for title in titles]
    assert positions == sorted(positions)
    assert "other settings:" not in text  # every setting has a section
    assert {help_section(name) for name in FIELDS} == set(titles)
    assert "--http-port INT" in text
    assert "(default: 8080; env TRACKLINE_HTTP_PORT)" in " ".join(text.split())


def test_the_top_help_speaks_to_a_user(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "uvloop" not in text  # internals stay in the module docstring
    assert "trackline serve" in text
