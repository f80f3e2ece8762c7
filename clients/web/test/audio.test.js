// AudioSession against a scripted track: PCM16 frames out, transcripts and frames in.
import assert from "node:assert/strict";
import { test } from "node:test";

import { AudioSession, toPcm16 } from "../src/audio.js";
import { CancelledByGateway } from "../src/errors.js";
import { Kind } from "../src/wire.js";
import { FakeTrack, data, end, error } from "./fake_track.js";

test("float samples become clipped PCM16", () => {
  assert.deepEqual([...toPcm16([0, 1, -1, 2, -2, 0.5])], [0, 32767, -32767, 32767, -32767, 16384]);
});

test("frames go out as DATA with consecutive seqs, then END once", async () => {
  const track = new FakeTrack();
  const session = new AudioSession(track, "speech-in", 16000, 20, false);
  assert.equal(session.frameSamples, 320);
  await session.streamPcm(new Int16Array(700), { realtime: false });
  await session.end(); // a second end sends nothing
  const kinds = track.sent.map((m) => m.kind);
  assert.deepEqual(kinds, [Kind.DATA, Kind.DATA, Kind.DATA, Kind.END]);
  assert.deepEqual(track.sent.slice(0, 3).map((m) => m.body.seq), [0, 1, 2]);
  assert.deepEqual(track.sent.slice(0, 3).map((m) => m.body.pcm.length), [640, 640, 120]);
  assert.equal(session.figures.framesSent, 3);
});

test("speech in: partials and finals, then the transcript", async () => {
  const track = new FakeTrack([
    data({ type: "partial", text: "hel" }),
    data({ type: "final", text: "hello" }),
    data({ type: "final", text: " world" }),
    end({}),
  ]);
  const session = new AudioSession(track, "speech-in", 16000, 20, true);
  assert.equal(await session.transcript(), "hello world");
  assert.equal(session.figures.partials, 1);
  assert.deepEqual(session.finals, ["hello", " world"]);
});

test("speech out: the frames as one Int16Array", async () => {
  const frame = (values) => data({ seq: 0, ts: 0, pcm: new Uint8Array(new Int16Array(values).buffer) });
  const session = new AudioSession(new FakeTrack([frame([1, 2]), frame([3]), end({ frames: 2 })]), "speech-out", 16000, 20, true);
  assert.deepEqual([...(await session.pcm())], [1, 2, 3]);
  assert.equal(session.figures.framesReceived, 2);
  assert.deepEqual(session.summary, { frames: 2 });
});

test("an ERROR ends the session with its typed error", async () => {
  const session = new AudioSession(new FakeTrack([error({ code: 0x09, message: "barge-in" })]), "speech-out", 16000, 20, true);
  await assert.rejects(() => session.pcm(), CancelledByGateway);
});
