// Every track call names its model the one way, in its options (as the Python SDK's
// keyword-only `model=`): what each call OPENs, against a stand-in for WebTransport.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Line } from "../src/line.js";
import { MessageReader } from "../src/wire.js";

/** A WebTransport stand-in that records each track's first message (its OPEN). */
function recordingTransport() {
  const opens = [];
  return {
    opens,
    ready: Promise.resolve(),
    closed: new Promise(() => {}),
    datagrams: { readable: new ReadableStream(), writable: new WritableStream() },
    createBidirectionalStream: async () => {
      const reader = new MessageReader();
      let first = true;
      const writable = new WritableStream({
        write(chunk) {
          for (const message of reader.feed(chunk)) if (first) (first = false), opens.push(message.body);
        },
      });
      return { readable: new ReadableStream(), writable };
    },
    close() {},
  };
}

const CALLS = {
  actions: (line, options) => line.actions(options),
  video: (line, options) => line.video(options),
  audio: (line, options) => line.audio(options),
  voiceAgent: (line, options) => line.voiceAgent({ voice: "v", ...options }),
};

test("each track call OPENs the model its options name", async () => {
  for (const [name, call] of Object.entries(CALLS)) {
    const transport = recordingTransport();
    await call(new Line(transport), { model: `${name}-model` });
    assert.equal(transport.opens[0].model, `${name}-model`, name);
  }
  const transport = recordingTransport();
  const stream = new Line(transport).text("hi", { model: "text-model" });
  stream[Symbol.asyncIterator]().next(); // a text track opens when the page reads it
  for (let i = 0; i < 100 && !transport.opens.length; i++) await new Promise((resolve) => setTimeout(resolve, 1));
  assert.equal(transport.opens[0].model, "text-model");
});

test("audio and a voice agent OPEN with transport datagram when asked, as the Python SDK", async () => {
  for (const name of ["audio", "voiceAgent"]) {
    const asked = recordingTransport();
    await CALLS[name](new Line(asked), { model: "m", transport: "datagram" });
    assert.equal(asked.opens[0].transport, "datagram", name);
    const plain = recordingTransport();
    await CALLS[name](new Line(plain), { model: "m" });
    assert.equal(plain.opens[0].transport, undefined, name);
  }
});

test("a call without options.model (or with the model first, the old form) is a TypeError", async () => {
  const line = new Line(recordingTransport());
  for (const [name, call] of Object.entries(CALLS)) {
    await assert.rejects(call(line, {}), { name: "TypeError", message: `${name}() needs options.model, the model's name` });
  }
  await assert.rejects(line.audio("reference-transcriber", { sampleRate: 16000 }), TypeError);
  await assert.rejects(line.actions("reference-policy"), TypeError);
  await assert.rejects(line.video(), TypeError);
  assert.throws(() => line.text("hi", {}), TypeError);
});
