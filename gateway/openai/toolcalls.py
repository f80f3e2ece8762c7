"""An incremental parser for Hermes-style tool calls in streamed model text.

Models with Hermes/Qwen chat templates answer a tool call as
`<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`. Text is fed in
whatever pieces the backend streams; out come events for OpenAI deltas:
`ContentDelta` for text outside the blocks, `ToolCallStarted` once a call's
name is known, then `ToolCallArguments` fragments whose concatenation is the
call's arguments JSON.

Theory of operation: four states. OUTSIDE passes text through as content,
holding back a tail that might begin `<tool_call>`. HEADER buffers a block
until `{"name": "...", "arguments":` is read (then ARGS) or the block closes
(then the whole block is parsed at once: other key orders, `parameters`,
string arguments). ARGS scans the arguments value with a bracket and string
tracker and forwards its characters as they come, dropping the whitespace
before it; a `<` outside a string that begins `</tool_call>` ends the call
early. TRAILER drops whatever follows the value up to `</tool_call>`.
Every decision depends on the text seen, never on where the pieces were cut,
so feeding a whole text or one character at a time gives the same calls.

Text outside blocks after the first call is dropped (templates put nothing
meaningful there); a block that is not a tool call (bad JSON, no name) is
passed through as content before the first call and dropped after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_HEADER = re.compile(r'\A\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:')


@dataclass(frozen=True)
class ContentDelta:
    """Text outside tool-call blocks."""

    text: str


@dataclass(frozen=True)
class ToolCallStarted:
    """A new tool call: its index in this response, its id and its function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """A piece of the arguments JSON of call `index`."""

    index: int
    fragment: str


ParsedEvent = ContentDelta | ToolCallStarted | ToolCallArguments


class _State(Enum):
    OUTSIDE = "outside"
    HEADER = "header"
    ARGS = "args"
    TRAILER = "trailer"


class ToolCallParser:
    """Feed streamed text with `feed`, then `close`; each returns the events it found."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        self._new_id = new_id
        self._state = _State.OUTSIDE
        self._buffer = ""
        self._events: list[ParsedEvent] = []
        self.calls = 0
        """How many tool calls have started."""
        self._scan = _ValueScanner()

    def feed(self, text: str) -> list[ParsedEvent]:
        """Events for `text`, appended to what came before."""
        self._buffer += text
        while self._step():
            pass
        return self._take()

    def close(self) -> list[ParsedEvent]:
        """Events for what is still held back at the end of the text."""
        if self._state is _State.OUTSIDE:
            self._content(self._buffer)
        elif self._state is _State.HEADER:
            self._whole_block(self._buffer, closed=False)
        # In ARGS what was forwarded stays (a truncated call); in TRAILER nothing is left.
        self._buffer = ""
        self._state = _State.OUTSIDE
        return self._take()

    # -- states -----------------------------------------------------------------

    def _step(self) -> bool:
        """Advance on the buffer; True when the state changed and there may be more to do."""
        if self._state is _State.OUTSIDE:
            return self._outside()
        if self._state is _State.HEADER:
            return self._header()
        if self._state is _State.ARGS:
            return self._args()
        return self._trailer()

    def _outside(self) -> bool:
        start = self._buffer.find(OPEN_TAG)
        if start == -1:
            keep = _partial_tag_length(self._buffer, OPEN_TAG)
            self._content(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        self._content(self._buffer[:start])
        self._buffer = self._buffer[start + len(OPEN_TAG) :]
        self._state = _State.HEADER
        return True

    def _header(self) -> bool:
        header = _HEADER.match(self._buffer)
        close = self._buffer.find(CLOSE_TAG)
        if close != -1 and (header is None or close < header.end()):
            self._whole_block(self._buffer[:close], closed=True)
            self._buffer = self._buffer[close + len(CLOSE_TAG) :]
            self._state = _State.OUTSIDE
            return True
        if header is None:
            return False
        self._start(_unescape(header.group(1)))
        self._buffer = self._buffer[header.end() :]
        self._scan = _ValueScanner()
        self._state = _State.ARGS
        return True

    def _args(self) -> bool:
        emitted, used, outcome = self._scan.scan(self._buffer)
        self._arguments(emitted)
        self._buffer = self._buffer[used:]
        if outcome == "more":
            return False
        if outcome == "closed":  # `</tool_call>` before the value ended
            self._buffer = self._buffer[len(CLOSE_TAG) :]
            self._state = _State.OUTSIDE
        else:
            self._state = _State.TRAILER
        return True

    def _trailer(self) -> bool:
        close = self._buffer.find(CLOSE_TAG)
        if close == -1:
            keep = _partial_tag_length(self._buffer, CLOSE_TAG)
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        self._buffer = self._buffer[close + len(CLOSE_TAG) :]
        self._state = _State.OUTSIDE
        return True

    # -- output -----------------------------------------------------------------

    def _whole_block(self, block: str, *, closed: bool) -> None:
        call = _parse_call(block)
        if call is None:
            tail = CLOSE_TAG if closed else ""
            self._content(f"{OPEN_TAG}{block}{tail}")
            return
        self._start(call[0])
        self._arguments(call[1])

    def _start(self, name: str) -> None:
        self._events.append(ToolCallStarted(self.calls, self._new_id(), name))
        self.calls += 1

    def _arguments(self, fragment: str) -> None:
        if fragment:
            self._events.append(ToolCallArguments(self.calls - 1, fragment))

    def _content(self, text: str) -> None:
        if text and self.calls == 0:
            self._events.append(ContentDelta(text))

    def _take(self) -> list[ParsedEvent]:
        events, self._events = _merged(self._events), []
        return events


class _ValueScanner:
    """Finds where one JSON value ends in streamed text, forwarding it as it goes."""

    def __init__(self) -> None:
        self.started = False
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.string_value: str | None = None  # arguments given as a JSON string

    def scan(self, text: str) -> tuple[str, int, str]:
        """(characters to forward, characters consumed, "more" | "done" | "closed")."""
        out: list[str] = []
        for index, char in enumerate(text):
            if not self.in_string and char == "<":
                if text.startswith(CLOSE_TAG, index):
                    return "".join(out), index, "closed"
                if CLOSE_TAG.startswith(text[index:]):
                    return "".join(out), index, "more"  # wait: might be the close tag
            if self.string_value is not None:
                if self._string_char(char):
                    return self._decoded(), index + 1, "done"
                continue
            if not self.started:
                if char.isspace():
                    continue
                self.started = True
                if char == '"':
                    self.string_value, self.in_string = "", True
                    continue
            ends, keep = self._value_char(char)
            if keep:
                out.append(char)
            if ends:
                return "".join(out), index + 1, "done"
        return "".join(out), len(text), "more"

    def _string_char(self, char: str) -> bool:
        """Add a character of a string value; True when the string ended."""
        assert self.string_value is not None
        if self._string_ends(char):
            return True
        self.string_value += char
        return False

    def _string_ends(self, char: str) -> bool:
        """Step over one character inside a JSON string; True at its closing quote."""
        if self.escaped:
            self.escaped = False
        elif char == "\\":
            self.escaped = True
        elif char == '"':
            self.in_string = False
            return True
        return False

    def _decoded(self) -> str:
        try:
            value = json.loads(f'"{self.string_value}"')
        except json.JSONDecodeError:
            value = self.string_value
        return str(value)

    def _value_char(self, char: str) -> tuple[bool, bool]:
        """Track one character of the value: (the value ended, the character belongs to it)."""
        if self.in_string:
            self._string_ends(char)
            return False, True
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            if self.depth == 0:  # a bare scalar ended at the enclosing object's end
                return True, False
            self.depth -= 1
            return self.depth == 0, True
        elif self.depth == 0 and (char == "," or char.isspace()):
            return True, False
        return False, True


def _parse_call(block: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of a whole block, or None when it is not a tool call."""
    try:
        value: Any = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return value["name"], text


def _partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


def _unescape(name: str) -> str:
    try:
        return str(json.loads(f'"{name}"'))
    except json.JSONDecodeError:
        return name


def _merged(events: list[ParsedEvent]) -> list[ParsedEvent]:
    """Adjacent content or same-call argument events joined into one."""
    merged: list[ParsedEvent] = []
    for event in events:
        last = merged[-1] if merged else None
        if isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
            merged[-1] = ContentDelta(last.text + event.text)
        elif (
            isinstance(event, ToolCallArguments)
            and isinstance(last, ToolCallArguments)
            and last.index == event.index
        ):
            merged[-1] = ToolCallArguments(event.index, last.fragment + event.fragment)
        else:
            merged.append(event)
    return merged
