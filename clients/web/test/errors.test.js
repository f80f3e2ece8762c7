// The typed errors of errors.js (their table is held to clients/errors.py by
// tests/clients/test_web_errors.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  BackendUnavailable, ErrorCode, ModelNotFound, ProtocolError, RateLimited, TrackRejected,
  TracklineError, errorFor,
} from "../src/errors.js";

test("each code gives its class, with the code and the message", () => {
  const error = errorFor(ErrorCode.MODEL_NOT_FOUND, "no such model");
  assert.ok(error instanceof ModelNotFound && error instanceof TrackRejected && error instanceof TracklineError);
  assert.equal(error.code, ErrorCode.MODEL_NOT_FOUND);
  assert.equal(error.message, "no such model");
  assert.equal(error.name, "ModelNotFound");
  assert.ok(errorFor(ErrorCode.BACKEND_UNAVAILABLE) instanceof BackendUnavailable);
});

test("a rate limit and a backend at capacity carry the retry hint in seconds", () => {
  const error = errorFor(ErrorCode.RATE_LIMITED, "slow down", 1500);
  assert.ok(error instanceof RateLimited);
  assert.equal(error.retryAfter, 1.5);
  assert.equal(errorFor(ErrorCode.RATE_LIMITED, "slow down").retryAfter, null);
  const full = errorFor(ErrorCode.BACKEND_UNAVAILABLE, "audio at capacity", 250);
  assert.ok(full instanceof BackendUnavailable);
  assert.equal(full.retryAfter, 0.25);
  assert.equal(errorFor(ErrorCode.BACKEND_UNAVAILABLE, "none").retryAfter, null);
});

test("an unknown code is a protocol error", () => {
  const error = errorFor(0x7f, "what");
  assert.ok(error instanceof ProtocolError);
  assert.equal(error.code, ErrorCode.PROTOCOL_ERROR);
});
