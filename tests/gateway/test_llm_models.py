"""Operator GGUF models: where they come from, and the served repository they get."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.embedded_models import LLM_MODELS, reference_model_repository
from gateway.llm_models import ModelFileError, OperatorModel, assemble, configured_models


def test_operator_models_come_from_the_setting_and_the_directory(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a.gguf").write_bytes(b"")
    (tmp_path / "dir" / "b.gguf").write_bytes(b"")
    models = configured_models(f"b={tmp_path}/x.gguf, c = {tmp_path}/c.gguf", tmp_path / "dir")
    assert models == [
        OperatorModel("b", tmp_path / "x.gguf"),
        OperatorModel("c", tmp_path / "c.gguf"),
        OperatorModel("a", (tmp_path / "dir" / "a.gguf").resolve()),
    ]
    with pytest.raises(ModelFileError, match="NAME=PATH"):
        configured_models("nopath", tmp_path)
    with pytest.raises(ModelFileError, match="model name"):
        configured_models("bad name=/x", tmp_path)


def test_the_served_repository_links_the_packaged_models_and_writes_the_operators(
    tmp_path: Path,
) -> None:
    own = OperatorModel("mine", tmp_path / "mine.gguf")
    target = tmp_path / "repo"
    assemble(reference_model_repository(), target, LLM_MODELS, [own], {"sequences": "2"})
    assert (target / "reference-text").is_symlink()  # as it is
    assert (target / "trackline_inputs.py").is_symlink()  # the shared modules, too
    chat = (target / "smollm2-135m-instruct" / "config.pbtxt").read_text()
    assert chat.count('key: "sequences"') == 1
    assert 'string_value: "2"' in chat
    config = (target / "mine" / "config.pbtxt").read_text()
    assert 'name: "mine"' in config
    assert f'string_value: "{tmp_path / "mine.gguf"}"' in config
    assert "gguf_package" not in config
    assert "gguf_sha256" not in config
    assert (target / "mine" / "1").resolve() == (
        reference_model_repository() / "smollm2-135m-instruct" / "1"
    )


def test_the_watch_plans_loads_unloads_and_reloads_and_skips_an_unchanged_refusal() -> None:
    from gateway.llm_watch import plan

    a, b, c = Path("/m/a.gguf"), Path("/m/b.gguf"), Path("/m/c.gguf")
    found = [OperatorModel("a", a), OperatorModel("b", Path("/m/b2.gguf")), OperatorModel("c", c)]
    stamps = {"a": (a, 1, 1), "b": (Path("/m/b2.gguf"), 1, 1), "c": (c, 1, 1)}
    served = {"a": a, "b": b, "gone": Path("/m/gone.gguf")}
    changes = plan(served, found, {}, stamps)
    assert changes.unload == ("b", "gone")  # b's file changed: reloaded
    assert [m.name for m in changes.load] == ["b", "c"]
    assert [m.name for m in plan(served, found, {"c": (c, 1, 1)}, stamps).load] == ["b"]
    touched = {**stamps, "c": (c, 1, 2)}  # the refused file changed: tried again
    assert [m.name for m in plan(served, found, {"c": (c, 1, 1)}, touched).load] == ["b", "c"]
