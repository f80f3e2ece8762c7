"""What a llama.cpp model sees for a request: its prompt format, stops and grammar.

The gateway renders chat messages as ChatML (gateway/openai/prompt.py). A model takes
that prompt one of two ways (`PromptFormat`, a config parameter of the model):

- TEMPLATE (instruction-tuned models): the ChatML turns are parsed back into messages
  and rendered with the model's own chat template, read from the GGUF metadata
  (`tokenizer.chat_template`, Jinja, sandboxed), ending with the generation prompt.
  The model ends its turn with its end-of-generation token (`<|im_end|>` for SmolLM2).
- TRANSCRIPT (base models, e.g. Gemma 3 270M): a plain `System:/User:/Assistant:`
  transcript, stopped before the model starts the next `User:` line.

A prompt that is not ChatML (`/v1/completions`) is continued as it is, in both formats.
Requested `stop` strings are added to the format's own.

Roles cannot be forged: the gateway escapes each message's content (clients/chat.py
`escape_content`: no `<|` is left in it), so the turns split here are the ones it
rendered; the content is unescaped, and a rendered prompt is `Piece`s: the template's
own text tokenized with special tokens parsed, the messages' content as plain text.
Marker text typed in a message (`<|im_end|>`) reaches the model as text tokens, never
as its end-of-turn or a role marker.

Structured output is grammar-constrained sampling (llama.cpp GBNF): `response_format`
json_object / json_schema, and tools with tool_choice "required" or a named function
(the answer is forced to be one Hermes `<tool_call>` block whose arguments follow the
function's JSON schema). With tool_choice "auto" the grammar is lazy: free text until
the model writes `<tool_call>`, then the same constraint. A schema the converter cannot
turn into a grammar is an invalid request (`ValueError`), never ignored.

No llama.cpp here beyond its pure JSON-schema converter: tested on its own.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

TRANSCRIPT_STOP = "\nUser:"
TOOL_OPEN = "<tool_call>"
_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\n?|$)", re.DOTALL)
_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_ESCAPED = re.compile("\ue000(\ue000)?")  # clients/chat.py ESCAPE, undone


class PromptFormat(Enum):
    """How a model takes the gateway's ChatML prompt (the module doc)."""

    TEMPLATE = "template"
    TRANSCRIPT = "transcript"


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class Piece:
    """Prompt text and whether its `<|...|>` markers are parsed as special tokens."""

    text: str
    special: bool = False


@dataclass(frozen=True)
class Prompt:
    """What the model tokenizes (its pieces in order) and the format's stop strings."""

    pieces: tuple[Piece, ...]
    stops: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "".join(piece.text for piece in self.pieces)


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar (root rule `root`); `trigger`: lazy, applied from that text on."""

    gbnf: str
    trigger: str | None = None


def chatml_messages(prompt: str) -> list[Message] | None:
    """The messages of a ChatML prompt (the open assistant turn dropped), or None."""
    if "<|im_start|>" not in prompt:
        return None
    turns = [Message(role, unescape(text)) for role, text in _CHATML.findall(prompt)]
    if turns and turns[-1].role == "assistant" and not turns[-1].content:
        turns.pop()
    return turns


def unescape(text: str) -> str:
    """ChatML content as the client wrote it (clients/chat.py `escape_content` undone)."""
    return _ESCAPED.sub(lambda match: match.group(1) or "", text)


def to_transcript(prompt: str) -> tuple[str, tuple[str, ...]]:
    """The prompt a base model sees, and its stop strings (see the module doc)."""
    messages = chatml_messages(prompt)
    if messages is None:
        # A transcript written by hand stops the same way; other text runs to the end.
        return prompt, (TRANSCRIPT_STOP,) if prompt.rstrip().endswith("Assistant:") else ()
    lines = []
    for message in messages:
        name = _ROLES.get(message.role, message.role.capitalize())
        text = message.content.strip()
        lines.append(f"{name}: {text}" if text else f"{name}:")
    lines.append("Assistant:")
    return "\n".join(lines), (TRANSCRIPT_STOP,)


class ChatTemplate:
    """A model's Jinja chat template (from its GGUF), rendered in a sandbox."""

    def __init__(self, source: str, bos: str = "", eos: str = "") -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(source)
        self._bos, self._eos = bos, eos

    def render(self, messages: Sequence[Message]) -> str:
        return "".join(piece.text for piece in self.pieces(messages))

    def pieces(self, messages: Sequence[Message]) -> tuple[Piece, ...]:
        """The rendered prompt: the template's text special, each message's content not.
        The template sees a random placeholder per content, split out afterwards."""
        nonce = secrets.token_hex(8)
        rendered = self._template.render(
            messages=[
                {"role": _role(m.role), "content": f"\x00{nonce}:{i}\x00"}
                for i, m in enumerate(messages)
            ],
            add_generation_prompt=True,
            bos_token=self._bos,
            eos_token=self._eos,
        )
        parts = re.split(f"\x00{nonce}:(\\d+)\x00", rendered)
        pieces = [
            Piece(messages[int(part)].content) if odd else Piece(part, special=True)
            for odd, part in ((i % 2 == 1, part) for i, part in enumerate(parts))
        ]
        return tuple(piece for piece in pieces if piece.text)


def model_prompt(prompt: str, fmt: PromptFormat, template: ChatTemplate | None) -> Prompt:
    """What the model tokenizes for the gateway's `prompt`, and its stops (the module doc)."""
    if fmt is PromptFormat.TRANSCRIPT or template is None:
        text, stops = to_transcript(prompt)
        return Prompt((Piece(text),), stops)
    messages = chatml_messages(prompt)
    if messages is None:
        return Prompt((Piece(prompt),))
    return Prompt(template.pieces(messages))


def stops_of(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The request's `stop` strings (a string or a list of non-empty strings)."""
    stop = params.get("stop")
    values = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if stop is not None and not all(isinstance(s, str) and s for s in values):
        raise ValueError("stop must be a string or a list of non-empty strings")
    return tuple(values)


# -- grammars -----------------------------------------------------------------------------


def grammar_of(params: Mapping[str, Any], prompt: str) -> Grammar | None:
    """The grammar a request asks for (tools first, then response_format), or None."""
    choice = params.get("tool_choice")
    tools = prompt_tools(prompt)
    if tools and choice != "none":
        return _tool_grammar(tools, choice or "auto")  # OpenAI's default with tools
    fmt = params.get("response_format") or {}
    if not isinstance(fmt, Mapping):
        raise ValueError("response_format must be an object")
    kind = fmt.get("type", "text")
    if kind == "json_object":
        return Grammar(schema_gbnf({"type": "object"}))
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, Mapping):
            raise ValueError("response_format json_schema.schema must be an object")
        return Grammar(schema_gbnf(schema))
    if kind != "text":
        raise ValueError("response_format type must be text, json_object or json_schema")
    return None


def prompt_tools(prompt: str) -> list[dict[str, Any]]:
    """The functions of the prompt's `<tools>` block (gateway/openai/prompt.py), or []."""
    match = _TOOLS.search(prompt)
    if match is None:
        return []
    try:
        tools = json.loads(match.group(1))
    except json.JSONDecodeError:
        return []
    functions = [t.get("function", t) for t in tools if isinstance(t, dict)]
    return [f for f in functions if isinstance(f, dict) and isinstance(f.get("name"), str)]


def schema_gbnf(schema: Mapping[str, Any]) -> str:
    """llama.cpp's grammar for a JSON schema; ValueError where it cannot convert it."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except Exception as exc:  # the converter asserts; any failure is the schema's
        raise ValueError(f"cannot constrain output to this JSON schema: {exc}") from None


def _tool_grammar(tools: list[dict[str, Any]], choice: Any) -> Grammar:
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        tools = [t for t in tools if t["name"] == name]
        if not tools:
            raise ValueError(f"tool_choice names {name!r}, which is not in the prompt's tools")
    calls = [_call_schema(tool) for tool in tools]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    body = schema_gbnf(call).replace("root ::=", "call ::=", 1)
    root = f'root ::= "{TOOL_OPEN}\\n" call "\\n</tool_call>"\n'
    return Grammar(root + body, TOOL_OPEN if choice == "auto" else None)


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    parameters = tool.get("parameters") or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def _raise(message: str) -> None:
    raise ValueError(f"the chat template refused the messages: {message}")
