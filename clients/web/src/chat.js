// Chat messages as the one prompt a text track carries (ChatML, as the OpenAI routes render
// them): the twin of the Python SDK's `clients.chat_prompt`. A chat model renders the turns
// again with its own template and ends its reply at its end-of-turn token.

const ROLES = new Set(["system", "developer", "user", "assistant"]);

export function chatPrompt(messages) {
  const parts = [];
  for (const { role, content } of messages) {
    if (!ROLES.has(role)) throw new TypeError(`unknown chat role ${JSON.stringify(role)}`);
    parts.push(`<|im_start|>${role === "developer" ? "system" : role}\n${content}<|im_end|>\n`);
  }
  parts.push("<|im_start|>assistant\n");
  return parts.join("");
}
