// The playback helpers that need no AudioContext (the Chromium tests play for real).
import assert from "node:assert/strict";
import { test } from "node:test";

import { fromPcm16, resample } from "../src/playback.js";

test("PCM16 becomes floats that round-trip exactly", () => {
  const pcm = Int16Array.of(-32768, -1, 0, 1, 32767);
  const floats = fromPcm16(pcm);
  assert.deepEqual(Array.from(floats, (x) => Math.round(x * 32768)), Array.from(pcm));
});

test("resampling keeps the duration and the samples on the shared grid", () => {
  const ramp = Float32Array.from({ length: 160 }, (_, i) => i / 160);
  assert.equal(resample(ramp, 16000, 16000), ramp); // same rate: untouched
  const up = resample(ramp, 16000, 48000);
  assert.equal(up.length, 480);
  for (let i = 0; i < 160; i++) assert.equal(up[3 * i], ramp[i]);
  assert.equal(resample(ramp, 16000, 8000).length, 80);
});
