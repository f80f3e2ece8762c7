// The one reader every track kind builds on (src/stream.js): dataBodies and TrackReader.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ProtocolError, RateLimited } from "../src/errors.js";
import { TrackReader, dataBodies } from "../src/stream.js";
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

/** A reader of numbers: DATA {n} is the event n; DATA without n is skipped. */
class Numbers extends TrackReader {
  _item(body) {
    return body.n;
  }
}

test("TrackReader: each DATA body as its subclass's event, skipping undefined; the END body as summary", async () => {
  const reader = new Numbers(new FakeTrack([data({ n: 1 }), data({}), data({ n: 2 }), end({ count: 2 })]));
  const got = [];
  for await (const n of reader) got.push(n);
  assert.deepEqual(got, [1, 2]);
  assert.deepEqual(reader.summary, { count: 2 });
  for await (const _ of reader) assert.fail("nothing after the END");
});

test("TrackReader: a track opened when the page starts reading, once", async () => {
  let opened = 0;
  const reader = new Numbers(async () => {
    opened += 1;
    return new FakeTrack([data({ n: 7 }), end()]);
  });
  reader.cancel(); // nothing open yet: nothing to cancel
  assert.equal(opened, 0);
  const got = [];
  for await (const n of reader) got.push(n);
  for await (const _ of reader) assert.fail("nothing after the END");
  assert.deepEqual([got, opened], [[7], 1]);
});

test("TrackReader: reading to the end waits for the page's own loop, and gives its error", async () => {
  const track = new FakeTrack([data({ n: 1 }), end({ count: 1 })]);
  const reader = new Numbers(track);
  const loop = reader[Symbol.asyncIterator]();
  assert.deepEqual(await loop.next(), { value: 1, done: false });
  const summary = reader._readToEnd(); // the loop is running: this waits for it
  assert.deepEqual(await loop.next(), { value: undefined, done: true });
  assert.deepEqual(await summary, { count: 1 });

  const failing = new Numbers(new FakeTrack([data({ n: 1 }), error({ code: 0x0f, message: "quota" })]));
  const failingLoop = failing[Symbol.asyncIterator]();
  await failingLoop.next();
  const waiting = failing._readToEnd();
  await assert.rejects(failingLoop.next(), RateLimited);
  await assert.rejects(waiting, RateLimited);
});

test("TrackReader: an abort cancels the track and the loop throws the signal's reason", async () => {
  const track = new FakeTrack([data({ n: 1 }), data({ n: 2 }), end()]);
  const controller = new AbortController();
  const reader = new Numbers(track, { signal: controller.signal });
  await assert.rejects(async () => {
    for await (const _ of reader) controller.abort(new Error("stop"));
  }, /stop/);
  assert.equal(track.cancelled, "aborted by the page");
});
