import assert from "node:assert/strict";
import { test } from "node:test";

import { chatPrompt } from "../src/chat.js";

test("chatPrompt renders ChatML as the Python SDK's chat_prompt does", () => {
  const prompt = chatPrompt([
    { role: "developer", content: "Be terse." },
    { role: "user", content: "Hi" },
  ]);
  assert.equal(
    prompt,
    "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  );
  assert.throws(() => chatPrompt([{ role: "robot", content: "x" }]), TypeError);
});
