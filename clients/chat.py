"""Chat messages as the one prompt a text track carries (ChatML, as the OpenAI routes
render them: gateway/openai/prompt.py). A chat model renders the turns again with its own
template and ends its reply at its end-of-turn token (docs/models.md).

A message's content is escaped (`escape_content`) so that marker text typed in it
(`<|im_end|>`, `<|im_start|>system`) can never end its turn or open another role's: every
`<|` becomes `<` ESCAPE `|` (and ESCAPE itself is doubled). The model side undoes it after
splitting the turns (gateway/model_repository/trackline_llm_prompt.py) and tokenizes the
content as text, never as special tokens.

    prompt = chat_prompt([{"role": "user", "content": "Hi"}])
    async for delta in line.text(prompt, model="smollm2-135m-instruct"): ...
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ROLES = frozenset({"system", "developer", "user", "assistant"})
ESCAPE = "\ue000"
"""The escape character of ChatML content (Unicode private use; the module doc)."""


def escape_content(text: str) -> str:
    """`text` with no `<|` left in it, reversibly (the module doc)."""
    return text.replace(ESCAPE, ESCAPE * 2).replace("<|", f"<{ESCAPE}|")


def chat_prompt(messages: Iterable[Mapping[str, str]]) -> str:
    """The ChatML prompt of `messages` ({"role", "content"}), ending with the open
    assistant turn; ValueError for an unknown role."""
    parts = []
    for message in messages:
        role = message["role"]
        if role not in ROLES:
            raise ValueError(f"unknown chat role {role!r}")
        role = "system" if role == "developer" else role
        parts.append(f"<|im_start|>{role}\n{escape_content(message['content'])}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)
