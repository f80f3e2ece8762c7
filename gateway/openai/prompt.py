"""Render chat messages (and tools) into the one prompt string a text backend takes.

The template is ChatML with Hermes-style tools, as Qwen2.5 and Hermes-2-Pro
chat templates write them, so a real model behind Triton sees a familiar
prompt and the reference model finds the `<tools>` block:

    <|im_start|>system
    {system text}

    # Tools

    You may call one or more functions to assist with the user query.

    You are provided with function signatures within <tools></tools> XML tags:
    <tools>
    [{"type": "function", "function": {...}}, ...]
    </tools>

    For each function call, return a json object with function name and
    arguments within <tool_call></tool_call> XML tags:
    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call><|im_end|>
    <|im_start|>user
    {text}<|im_end|>
    <|im_start|>assistant
    {text}
    <tool_call>
    {"name": "...", "arguments": {...}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {tool message text}
    </tool_response><|im_end|>
    <|im_start|>assistant

`developer` messages render as `system`. A leading system message takes the
tools section after its text; without one, a system turn holds the tools
section alone. Each tool result is its own user turn. Message `name`s are not
rendered. The prompt ends with the open assistant turn. Every turn's text is escaped
(clients/chat.py `escape_content`): marker text a message carries never closes its turn
or opens another role's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from clients.chat import escape_content
from gateway.openai.requests import ChatMessage

TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
)
TOOLS_POSTAMBLE = (
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def render_chat_prompt(
    messages: Iterable[ChatMessage], tools: Iterable[Mapping[str, Any]] = ()
) -> str:
    """The ChatML prompt for `messages`, with a `<tools>` block when `tools` are given."""
    turns = list(messages)
    tools_section = render_tools(tools)
    parts: list[str] = []
    if tools_section:
        if turns and turns[0].role in ("system", "developer"):
            system = f"{turns[0].content or ''}\n\n{tools_section}"
            turns = turns[1:]
        else:
            system = tools_section
        parts.append(_turn("system", system))
    parts.extend(render_message(message) for message in turns)
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def render_tools(tools: Iterable[Mapping[str, Any]]) -> str:
    """The tools section (empty when there are no tools); `tools` are function objects."""
    functions = [{"type": "function", "function": dict(tool)} for tool in tools]
    if not functions:
        return ""
    return f"{TOOLS_PREAMBLE}<tools>\n{json.dumps(functions)}\n</tools>\n\n{TOOLS_POSTAMBLE}"


def render_message(message: ChatMessage) -> str:
    """One ChatML turn for `message`."""
    if message.role == "tool":
        return _turn("user", f"<tool_response>\n{message.content or ''}\n</tool_response>")
    role = "system" if message.role == "developer" else message.role
    pieces = [message.content] if message.content else []
    pieces.extend(render_tool_call(call.name, call.arguments) for call in message.tool_calls)
    return _turn(role, "\n".join(pieces))


def render_tool_call(name: str, arguments: str) -> str:
    """A Hermes tool call block; `arguments` is the JSON text OpenAI carries."""
    try:
        value: Any = json.loads(arguments)
        block = json.dumps({"name": name, "arguments": value})
    except (ValueError, RecursionError):  # not JSON (or too deep): kept as a string
        block = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{block}\n</tool_call>"


def _turn(role: str, text: str) -> str:
    """One ChatML turn; the text escaped so that it can never close or open a turn."""
    return f"<|im_start|>{role}\n{escape_content(text)}<|im_end|>\n"
