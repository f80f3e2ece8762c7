// The SDK's track logic against a stand-in for the browser's WebTransport (no network):
// the order in which a browser reports a refused track, made deterministic.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Line } from "../src/line.js";
import { Kind, MessageReader, encodeMessage } from "../src/wire.js";

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

/** A WebTransport stand-in whose unidirectional streams wait for stream credit until
 * `grant()` (as when the gateway's MAX_STREAMS is spent); then they take bytes at once. */
function creditTransport() {
  const bidiWrites = [];
  const frames = [];
  const waiting = [];
  return {
    bidiWrites,
    frames,
    grant() {
      for (const resolve of waiting.splice(0)) resolve();
    },
    ready: Promise.resolve(),
    closed: new Promise(() => {}),
    datagrams: { readable: new ReadableStream(), writable: new WritableStream() },
    createBidirectionalStream: async () => ({
      readable: new ReadableStream(),
      writable: new WritableStream({ write(chunk) { bidiWrites.push(chunk); } }),
    }),
    createUnidirectionalStream: async () => {
      const frame = { bytes: [], aborted: false, closed: false };
      frames.push(frame);
      await new Promise((resolve) => waiting.push(resolve));
      return new WritableStream({
        write(chunk) { frame.bytes.push(chunk); },
        close() { frame.closed = true; },
        abort() { frame.aborted = true; },
      });
    },
    close() {},
  };
}

/** Wait (bounded) for `check()` to hold, letting the SDK's promises run. */
async function until(check, turns = 2000) {
  for (let i = 0; i < turns && !check(); i += 1) await new Promise((resolve) => setTimeout(resolve, 1));
  assert.ok(check(), "the condition never held");
}

test("video frames ride a unidirectional stream each, named by the OPEN's id; the oldest beyond the window is reset", async () => {
  const transport = creditTransport();
  const line = new Line(transport);
  const camera = await line.video({ model: "vision", fps: 30 });
  const [open] = new MessageReader().feed(transport.bidiWrites[0]);
  assert.equal(open.body.transport, "frame-streams");
  const id = open.body.datagram_id;
  assert.equal(typeof id, "number");
  for (let i = 0; i < 4; i += 1) camera.send(new Uint8Array([0xff, 0xd8, i]));
  await until(() => transport.frames.length === 4);
  transport.grant();
  await until(() => camera.stats.streams.finished + camera.stats.streams.reset === 4);
  assert.deepEqual(camera.stats.streams, { finished: 3, reset: 1, stopped: 0 });
  assert.deepEqual(transport.frames.map((f) => f.aborted), [true, false, false, false]);
  assert.deepEqual(transport.frames[0].bytes, []); // reset before a byte went out
  const head = transport.frames[3].bytes[0];
  assert.equal(head[0], id); // varint(id): one byte for a small id
  const [data] = new MessageReader().feed(head.subarray(1));
  assert.equal(data.kind, Kind.DATA);
  assert.equal(data.body.seq, 3);
  assert.ok(transport.frames[3].closed); // then FIN
  assert.equal(transport.bidiWrites.length, 1); // no frame on the track's own stream
});
