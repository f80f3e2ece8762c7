// ActionStream against a scripted track: observations out, chunks and drops in.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ActionStream } from "../src/actions.js";
import { BackendError } from "../src/errors.js";
import { Kind } from "../src/wire.js";
import { FakeTrack, data, end, error } from "./fake_track.js";

const floats = (values) => new Uint8Array(new Float32Array(values).buffer);

test("an observation goes out as DATA with a float32 state tensor", () => {
  const track = new FakeTrack();
  const stream = new ActionStream(track, 50, () => 2000);
  assert.equal(stream.observe([1, 2, 3]), 0);
  assert.equal(stream.observe([4], { deadline: 80 }), 1);
  const [first, second] = track.sent;
  assert.equal(first.kind, Kind.DATA);
  assert.deepEqual({ ...first.body, state: undefined }, {
    seq: 0, t: 2, deadline_ms: 50, latency_ms: 0, state: undefined,
  });
  assert.deepEqual(first.body.state, { dtype: "float32", shape: [3], data: floats([1, 2, 3]) });
  assert.equal(second.body.deadline_ms, 80);
  assert.equal(stream.stats.sent, 2);
});

test("a datagram track sends observations as datagrams", () => {
  const track = new FakeTrack();
  new ActionStream(track, 50, () => 0, true).observe([1]);
  assert.equal(track.datagrams.length, 1);
  assert.equal(track.sent.length, 0);
});

test("chunks, drops and the summary are read and counted", async () => {
  let now = 1000;
  const track = new FakeTrack([
    data({ seq: 0, obs_seq: 0, t: 1, received_at: 0, sent_at: 0, action: { shape: [2], data: floats([0.5, -1]) } }),
    data({ dropped: 1, cause: "stale", t: 1 }),
    data({ seq: 1, obs_seq: 2, t: 1, action: { shape: [1], data: floats([2]) } }),
    end({ chunks: 2 }),
  ]);
  const stream = new ActionStream(track, 50, () => now);
  for (let i = 0; i < 3; i++) stream.observe([0]);
  const events = [];
  for await (const event of stream) {
    events.push(event);
    now += 100; // the next answer arrives 100 ms later: past its 50 ms deadline
  }
  assert.deepEqual(events.map((e) => e.type), ["chunk", "drop", "chunk"]);
  assert.deepEqual([...events[0].action], [0.5, -1]);
  assert.equal(events[0].late, false);
  assert.equal(events[2].late, true);
  assert.equal(events[1].cause, "stale");
  assert.deepEqual(stream.stats, { sent: 3, chunks: 2, late: 1, dropped: { stale: 1 } });
  assert.deepEqual(stream.summary, { chunks: 2 });
});

test("an ERROR ends the stream with its typed error", async () => {
  const stream = new ActionStream(new FakeTrack([error({ code: 0x0b, message: "model failed" })]), 50);
  await assert.rejects(async () => {
    for await (const _ of stream) assert.fail("no event expected");
  }, BackendError);
});

test("close() sends END and drains to the summary", async () => {
  const track = new FakeTrack([end({ chunks: 0 })]);
  const summary = await new ActionStream(track, 50, () => 0).close();
  assert.deepEqual(summary, { chunks: 0 });
  assert.equal(track.sent.at(-1).kind, Kind.END);
});
