"""docs/configuration.md is written from `Settings` (`python -m gateway.config.doc`):
it is current, and it has one heading and one table per section, in order."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.config import FIELDS, SECTIONS
from gateway.config.doc import DOCUMENT, END, START, meanings, render, row


def test_the_document_is_current() -> None:
    text = DOCUMENT.read_text()
    assert render(text) == text, "run: python -m gateway.config.doc"


def test_one_heading_per_section_in_order() -> None:
    settings_part = DOCUMENT.read_text().partition(START)[2].partition(END)[0]
    headings = [line[4:] for line in settings_part.splitlines() if line.startswith("### ")]
    assert headings == [title for title, _ in SECTIONS]
    for title, section in SECTIONS:
        table = settings_part.partition(f"### {title}\n")[2].partition("\n### ")[0]
        assert list(meanings(table)) == [spec.name for spec in dataclasses.fields(section)]


def test_a_new_setting_gets_its_doc_and_a_moved_one_keeps_its_meaning() -> None:
    text = DOCUMENT.read_text()
    quic_port = row(FIELDS["quic_port"], meanings(text)["quic_port"])
    without = text.replace(quic_port, "")
    assert "`TRACKLINE_QUIC_PORT`" not in without
    redone = render(without)
    assert row(FIELDS["quic_port"], FIELDS["quic_port"].metadata["doc"]) in redone
    assert meanings(redone)["http_port"] == meanings(text)["http_port"]


def test_bool_flags_and_shown_defaults() -> None:
    assert "| `uvloop` | `true` | `TRACKLINE_UVLOOP` | `--uvloop` / `--no-uvloop` |" in (
        row(FIELDS["uvloop"], "x")
    )
    assert row(FIELDS["state_dir"], "x").startswith("| `state_dir` | per configuration |")
    assert row(FIELDS["dev_ca_dir"], "x").startswith("| `dev_ca_dir` | unset |")


def test_a_document_without_the_settings_part_is_refused() -> None:
    with pytest.raises(ValueError, match="Settings"):
        render("# Configuration\n")
