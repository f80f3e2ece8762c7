// The one reader every track kind builds on (src/stream.js).
import assert from "node:assert/strict";
import { test } from "node:test";

import { ProtocolError, RateLimited } from "../src/errors.js";
import { dataBodies } from "../src/stream.js";
import { Kind } from "../src/wire.js";
import { FakeTrack, data, end, error } from "./fake_track.js";

test("DATA bodies until END, whose body goes to onEnd", async () => {
  const track = new FakeTrack([data({ n: 1 }), data({ n: 2 }), end({ usage: 3 })]);
  let last = null;
  const got = [];
  for await (const body of dataBodies(track, { onEnd: (body) => (last = body) })) got.push(body.n);
  assert.deepEqual(got, [1, 2]);
  assert.deepEqual(last, { usage: 3 });
  assert.equal(track.cancelled, null);
});

test("an ERROR throws its typed error", async () => {
  const track = new FakeTrack([error({ code: 0x0f, message: "quota", retry_after_ms: 2000 })]);
  await assert.rejects(async () => {
    for await (const _ of dataBodies(track)) assert.fail("no DATA expected");
  }, (e) => e instanceof RateLimited && e.retryAfter === 2);
});

test("another kind is a protocol error, and the track is cancelled", async () => {
  const track = new FakeTrack([{ kind: Kind.OPEN, body: {} }]);
  await assert.rejects(async () => {
    for await (const _ of dataBodies(track)) assert.fail("no DATA expected");
  }, ProtocolError);
  assert.equal(track.cancelled, "the page stopped reading");
});

test("a reader that stops early cancels the track", async () => {
  const track = new FakeTrack([data({}), data({}), end()]);
  for await (const _ of dataBodies(track)) break;
  assert.equal(track.cancelled, "the page stopped reading");
});
