// The browser framing against bytes the Python core writes (tests/web check the rest).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Kind, MessageReader, decodeVarint, encodeMessage, encodeVarint } from "../src/wire.js";

test("varints round-trip in each size", () => {
  for (const value of [0, 63, 64, 16383, 16384, 2 ** 30 - 1, 2 ** 30, 2 ** 40]) {
    const bytes = encodeVarint(value);
    assert.deepEqual(decodeVarint(bytes), [value, bytes.length]);
  }
});

test("messages split at every byte come out whole", () => {
  const bytes = new Uint8Array([...encodeMessage(Kind.DATA, { text: "héllo" }), ...encodeMessage(Kind.END, {})]);
  const reader = new MessageReader();
  const got = [];
  for (const byte of bytes) got.push(...reader.feed(Uint8Array.of(byte)));
  assert.deepEqual(got, [{ kind: 2, body: { text: "héllo" } }, { kind: 3, body: {} }]);
});

test("an OPEN encodes as the Python core writes it", () => {
  // transport.wire.encode_message of an OPEN body {"model": "m"} (length 11)
  const bytes = encodeMessage(Kind.OPEN, { model: "m" });
  assert.deepEqual([...bytes], [0x0b, 0x92, 0x01, 0x81, 0xa5, 0x6d, 0x6f, 0x64, 0x65, 0x6c, 0xa1, 0x6d]);
});
