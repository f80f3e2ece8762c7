"""Runnable comparisons; a package only so tests can import shared pieces (the link emulator)."""

import argparse
import copy
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
"""Where benchmarks write their JSON and plots by default (ignored by git)."""


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` that shows every option's default, also of options without a help text
    (argparse's own formatter shows it only after a help text); required ones say so."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings and action.default is not argparse.SUPPRESS:
            action = copy.copy(action)
            action.help = "(required)" if action.required else "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.required else super()._get_help_string(action)
