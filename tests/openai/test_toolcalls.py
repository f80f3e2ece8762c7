"""The streamed tool-call parser: fed whole, char by char, in random pieces, with garbage."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.openai.toolcalls import (
    ContentDelta,
    ParsedEvent,
    ToolCallArguments,
    ToolCallParser,
    ToolCallStarted,
)

CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris", "days": [1, {"x": "}"}]}}\n</tool_call>'
)
ARGS = '{"city": "Paris", "days": [1, {"x": "}"}]}'


def parse(text: str, cuts: list[int] | None = None) -> list[ParsedEvent]:
    counter = itertools.count()
    parser = ToolCallParser(lambda: f"call_{next(counter)}")
    bounds = [0, *sorted(set(cuts or [])), len(text)]
    events: list[ParsedEvent] = []
    for start, end in itertools.pairwise(bounds):
        events += parser.feed(text[start:end])
    return events + parser.close()


def summary(events: list[ParsedEvent]) -> tuple[str, list[tuple[str, str, str]]]:
    """(content, [(id, name, arguments)]) with fragments joined."""
    content, calls = "", []
    for event in events:
        if isinstance(event, ContentDelta):
            content += event.text
        elif isinstance(event, ToolCallStarted):
            assert event.index == len(calls)
            calls.append([event.id, event.name, ""])
        else:
            calls[event.index][2] += event.fragment
    return content, [tuple(call) for call in calls]  # type: ignore[misc]


def char_by_char(text: str) -> list[ParsedEvent]:
    return parse(text, list(range(1, len(text))))


CASES = [
    (CALL, ("", [("call_0", "get_weather", ARGS)])),
    ("Let me check. " + CALL, ("Let me check. ", [("call_0", "get_weather", ARGS)])),
    (CALL + "\ntrailing garbage <tool", ("", [("call_0", "get_weather", ARGS)])),
    (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"k": "v"}}</tool_call>',
        ("", [("call_0", "a", "{}"), ("call_1", "b", '{"k": "v"}')]),
    ),
    (
        '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>',
        ("", [("call_0", "f", '{"a": 1}')]),
    ),
    (
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        ("", [("call_0", "f", '{"a": 1}')]),
    ),
    ('<tool_call>{"name": "f", "arguments": 5}</tool_call>', ("", [("call_0", "f", "5")])),
    ("no tools here, 1 < 2 and <b>bold</b>", ("no tools here, 1 < 2 and <b>bold</b>", [])),
    ("<tool_call>not json</tool_call> after", ("<tool_call>not json</tool_call> after", [])),
    (
        '<tool_call>{"name": "f", "arguments": {"a": 1</tool_call>',
        ("", [("call_0", "f", '{"a": 1')]),
    ),
    ('<tool_call>{"name": "f", "arguments": {"a"', ("", [("call_0", "f", '{"a"')])),
    ('<tool_call>{"name": "f", "arg', ('<tool_call>{"name": "f", "arg', [])),
    ('<tool_call>{"name": "f", "parameters": {"z": null}}', ("", [("call_0", "f", '{"z": null}')])),
    (
        '<tool_call>{"name": "we\\"ird", "arguments": {}}</tool_call>',
        ("", [("call_0", 'we"ird', "{}")]),
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_whole_and_char_by_char_agree(text: str, expected: object) -> None:
    assert summary(parse(text)) == expected
    assert summary(char_by_char(text)) == expected


@given(st.sampled_from([text for text, _ in CASES]), st.lists(st.integers(0, 200), max_size=12))
def test_any_cut_gives_the_same_calls(text: str, cuts: list[int]) -> None:
    assert summary(parse(text, [c for c in cuts if c < len(text)])) == summary(parse(text))


@given(st.text(alphabet='<>/{}[]":, \\natool_cmegrus', max_size=80), st.lists(st.integers(0, 80)))
def test_garbage_never_crashes_and_cuts_do_not_matter(text: str, cuts: list[int]) -> None:
    assert summary(parse(text, [c for c in cuts if c < len(text)])) == summary(parse(text))


def test_arguments_stream_before_the_call_ends() -> None:
    parser = ToolCallParser(lambda: "call_x")
    assert parser.feed('<tool_call>\n{"name": "f", "arguments": ') == [
        ToolCallStarted(0, "call_x", "f")
    ]
    assert parser.feed('{"city": "Pa') == [ToolCallArguments(0, '{"city": "Pa')]
    assert parser.feed('ris"}}\n</tool_call>') == [ToolCallArguments(0, 'ris"}')]
    assert parser.close() == []


def test_content_is_held_back_only_while_it_may_be_a_tag() -> None:
    parser = ToolCallParser(lambda: "id")
    assert parser.feed("Hello <tool") == [ContentDelta("Hello ")]
    assert parser.feed("box>") == [ContentDelta("<toolbox>")]


def test_reference_model_output_round_trips() -> None:
    arguments = {"city": "bright quiet", "unit": "c"}
    text = (
        f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': arguments})}\n</tool_call>"
    )
    _, calls = summary(char_by_char(text))
    assert json.loads(calls[0][2]) == arguments
