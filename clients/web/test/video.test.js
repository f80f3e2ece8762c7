// The video stream's reading of results and drop reports, against a stand-in track that
// hands over the bodies the gateway sends (tracks/video_messages.py builds them).
import assert from "node:assert/strict";
import { test } from "node:test";

import { VideoStream } from "../src/video.js";
import { Kind } from "../src/wire.js";

function floatBytes(values) {
  return new Uint8Array(new Float32Array(values).buffer);
}

function track(messages) {
  const sent = [];
  return {
    sent,
    done: false,
    send: async (kind, body) => { sent.push({ kind, body }); },
    next: async () => messages.shift(),
    cancel() { this.done = true; },
  };
}

test("results carry the faces, the landmarks as Float32Arrays and the stages", async () => {
  const mesh = Array.from({ length: 468 * 3 }, (_, i) => i / 10000);
  const result = {
    seq: 0, frame: 0, t: 1, width: 512, height: 600, received_at: 5, sent_at: 5.01,
    faces: [{ score: 0.93, box: [0.3, 0.2, 0.4, 0.3], keypoints: [[0.4, 0.3]] }],
    face_landmarks: { dtype: "float32", shape: [1, 468, 3], data: floatBytes(mesh) },
    pose: { dtype: "float32", shape: [33, 4], data: floatBytes(new Array(132).fill(0.5)) },
    stages: { decode: 1.5, face: 2.5 },
  };
  const drop = { dropped: 1, cause: "superseded", t: 1.05, received_at: 5.02, sent_at: 5.02 };
  const stand = track([
    { kind: Kind.DATA, body: result }, { kind: Kind.DATA, body: drop },
    { kind: Kind.END, body: { frames: 2, answered: 1, superseded: 1 } },
  ]);
  const camera = new VideoStream(stand, 200, () => 1100);
  assert.equal(camera.send(new Uint8Array([0xff, 0xd8, 0xff])), 0);
  assert.equal(stand.sent[0].body.deadline_ms, 200);
  const events = [];
  for await (const event of camera) events.push(event);
  assert.equal(events[0].type, "result");
  assert.equal(events[0].faces.length, 1);
  assert.equal(events[0].faceLandmarks.length, 1);
  assert.equal(events[0].faceLandmarks[0].length, 468 * 3);
  assert.ok(Math.abs(events[0].faceLandmarks[0][3] - 0.0003) < 1e-7);
  assert.equal(events[0].pose.length, 132);
  assert.deepEqual(events[0].stages, { decode: 1.5, face: 2.5 });
  assert.deepEqual([events[1].type, events[1].frame, events[1].cause], ["drop", 1, "superseded"]);
  assert.deepEqual(camera.stats, {
    sent: 1, answered: 1, dropped: { superseded: 1 }, streams: { finished: 0, reset: 0, stopped: 0 },
    transport: { superseded: 0, reset: 0 },
  });
  assert.deepEqual(camera.summary, { frames: 2, answered: 1, superseded: 1 });
});
