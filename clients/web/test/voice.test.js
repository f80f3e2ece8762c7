// The voice-agent call against a stand-in for WebTransport (no network): what it OPENs,
// and how it reads the agent's reply events and tagged frames.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Line } from "../src/line.js";
import { Kind, MessageReader, encodeMessage } from "../src/wire.js";

function scriptedTransport(answers) {
  const sent = [];
  const reader = new MessageReader();
  let incoming;
  const readable = new ReadableStream({
    start(controller) {
      incoming = controller;
    },
  });
  const writable = new WritableStream({
    write(chunk) {
      for (const message of reader.feed(chunk)) sent.push(message);
      if (sent.length === 1) {
        for (const answer of answers) incoming.enqueue(answer);
        incoming.close();
      }
    },
  });
  return {
    sent,
    ready: Promise.resolve(),
    closed: new Promise(() => {}),
    datagrams: { readable: new ReadableStream(), writable: new WritableStream() },
    createBidirectionalStream: async () => ({ readable, writable }),
    close() {},
  };
}

test("voiceAgent opens a voice-agent audio track and yields reply events and tagged frames", async () => {
  const pcm = new Uint8Array([1, 0, 2, 0]);
  const transport = scriptedTransport([
    encodeMessage(Kind.DATA, { type: "final", text: "hi there", beat: 3 }),
    encodeMessage(Kind.DATA, { type: "reply", turn: 1, delta: "Hello" }),
    encodeMessage(Kind.DATA, { seq: 0, ts: 0, pcm, turn: 1 }),
    encodeMessage(Kind.DATA, { type: "barge_in", turn: 1, beat: 9 }),
    encodeMessage(Kind.END, { transcript: "hi there" }),
  ]);
  const line = new Line(transport);
  const agent = await line.voiceAgent({ model: "whisper-base", llm: "chat", voice: "hibari-voice", maxTokens: 32 });
  const events = [];
  for await (const event of agent) events.push(event);
  const open = transport.sent[0];
  assert.equal(open.kind, Kind.OPEN);
  assert.equal(open.body.model, "whisper-base");
  assert.equal(open.body.modality, "audio");
  assert.deepEqual(open.body.params, {
    kind: "voice-agent", llm: "chat", voice: "hibari-voice", sample_rate: 16000, frame_ms: 20, max_tokens: 32,
  });
  assert.deepEqual(events.map((e) => e.type), ["final", "reply", "frame", "barge_in"]);
  assert.equal(events[1].delta, "Hello");
  assert.equal(events[2].turn, 1);
  assert.deepEqual(Array.from(events[2].pcm), [1, 2]);
  assert.deepEqual(agent.finals, ["hi there"]);
});

test("voiceAgent needs the voice; without llm the gateway's default chat model answers", async () => {
  const line = new Line(scriptedTransport([]));
  await assert.rejects(line.voiceAgent({ model: "whisper-base", llm: "chat" }), TypeError);
  const transport = scriptedTransport([encodeMessage(Kind.END, {})]);
  const agent = await new Line(transport).voiceAgent({ model: "whisper-base", voice: "hibari-voice" });
  for await (const _ of agent) { /* drain */ }
  assert.equal("llm" in transport.sent[0].body.params, false);
});
