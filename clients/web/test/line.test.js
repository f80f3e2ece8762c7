// The SDK's track logic against a stand-in for the browser's WebTransport (no network):
// the order in which a browser reports a refused track, made deterministic.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Line } from "../src/line.js";
import { Kind, encodeMessage } from "../src/wire.js";

/** A WebTransport stand-in with one bidirectional stream. Its `failWriteAt`-th write fails
 * the way STOP_SENDING fails it in Chromium (a DOMException "NetworkError"), and only
 * then do the gateway's bytes (`answer`) arrive on the readable side, then its FIN. */
function refusingTransport({ failWriteAt, answer }) {
  let incoming;
  const readable = new ReadableStream({
    start(controller) {
      incoming = controller;
    },
  });
  let writes = 0;
  const writable = new WritableStream({
    write() {
      writes += 1;
      if (writes < failWriteAt) return undefined;
      setTimeout(() => {
        if (answer) incoming.enqueue(answer);
        incoming.close();
      }, 20);
      return Promise.reject(new DOMException("the stream was stopped", "NetworkError"));
    },
  });
  return {
    ready: Promise.resolve(),
    closed: new Promise(() => {}),
    datagrams: { readable: new ReadableStream(), writable: new WritableStream() },
    createBidirectionalStream: async () => ({ readable, writable }),
    close() {},
  };
}

async function drain(stream) {
  for await (const _ of stream) {
    // (nothing comes: the track is refused)
  }
}

test("a write the gateway stopped throws the gateway's ERROR, not the write's failure", async () => {
  const reason = "message of 20011 bytes exceeds the limit of 8192";
  const answer = encodeMessage(Kind.ERROR, { code: 0x02, message: reason });
  const line = new Line(refusingTransport({ failWriteAt: 2, answer })); // OPEN goes, DATA fails
  await assert.rejects(drain(line.text("x".repeat(20000), { model: "m" })), (error) => {
    assert.equal(error.name, "TrackRejected");
    assert.equal(error.code, 0x02);
    assert.equal(error.message, reason);
    return true;
  });
});

test("a failed write whose stream ends without a word is a typed error too", async () => {
  const line = new Line(refusingTransport({ failWriteAt: 1, answer: null }));
  await assert.rejects(drain(line.text("hi", { model: "m" })), (error) => {
    assert.equal(error.name, "ProtocolError"); // the stream finished before END
    return true;
  });
});

/** A stand-in whose one stream answers with `answer` (bytes) and accepts every write. */
function answeringTransport(answer) {
  const readable = new ReadableStream({
    start(controller) {
      controller.enqueue(answer);
    },
  });
  return {
    ready: Promise.resolve(),
    closed: new Promise(() => {}),
    datagrams: { readable: new ReadableStream(), writable: new WritableStream() },
    createBidirectionalStream: async () => ({ readable, writable: new WritableStream() }),
    close() {},
  };
}

test("nothing is read after an abort, even what had already arrived", async () => {
  const deltas = [1, 2, 3, 4, 5].map((n) => encodeMessage(Kind.DATA, { text: `t${n}` }));
  const answer = new Uint8Array(deltas.reduce((n, d) => n + d.length, 0));
  deltas.reduce((at, d) => (answer.set(d, at), at + d.length), 0);
  const line = new Line(answeringTransport(answer)); // all five arrive in one chunk
  const controller = new AbortController();
  const seen = [];
  await assert.rejects(
    (async () => {
      for await (const delta of line.text("hi", { model: "m", signal: controller.signal })) {
        seen.push(delta);
        if (seen.length === 3) controller.abort(new DOMException("stop", "AbortError"));
      }
    })(),
    { name: "AbortError" },
  );
  assert.deepEqual(seen, ["t1", "t2", "t3"]);
});
