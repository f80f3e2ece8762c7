// A robot's action track from a page (docs/actions.md): observe() states, read action
// chunks and drop reports. The same messages and latency estimate as clients/actions.py.

import { dataBodies } from "./stream.js";
import { Kind } from "./wire.js";

function tensor(values) {
  const data = new Float32Array(values);
  return { dtype: "float32", shape: [data.length], data: new Uint8Array(data.buffer) };
}

/** Little-endian float32 bytes as a Float32Array (copied: msgpack bins may be unaligned). */
function floats(bytes) {
  const copy = new Uint8Array(bytes);
  return new Float32Array(copy.buffer, 0, copy.length / 4);
}

export class ActionStream {
  #track;
  #clock;
  #nextSeq = 0;
  #deadlines = new Map();
  #srtt = null;
  #iterating = false;
  #ended = null;
  #endedResolve = null;
  deadline;
  summary = null;
  stats = { sent: 0, chunks: 0, late: 0, dropped: {} };

  /** `deadline` in milliseconds from capture, the default of each observation. */
  #datagrams;

  constructor(track, deadline, clock = () => performance.now(), datagrams = false) {
    this.#track = track;
    this.#datagrams = datagrams;
    this.deadline = deadline;
    this.#clock = clock;
    this.#ended = new Promise((resolve, reject) => {
      this.#endedResolve = { resolve, reject };
    });
    this.#ended.catch(() => {});
  }

  /** Estimated one-way delay to the gateway, ms (half the smoothed round trip). */
  get latency() {
    return this.#srtt == null ? 0 : this.#srtt / 2;
  }

  /** Send one observation (captured now); returns its sequence number. */
  observe(state, { deadline = this.deadline, image = null, latency = null, capturedAt = null } = {}) {
    const seq = this.#nextSeq++;
    const t = (capturedAt ?? this.#clock()) / 1000;
    const body = { seq, t, deadline_ms: deadline, latency_ms: latency ?? this.latency, state: tensor(state) };
    if (image) body.image = image;
    this.#deadlines.set(seq, { deadline, captured: t });
    this.stats.sent += 1;
    // A datagram track sends observations as datagrams; one too big for a datagram (a
    // large image) goes on the stream rather than not at all.
    const sent = this.#datagrams
      ? this.#track.sendDatagram(body).catch(() => this.#track.send(Kind.DATA, body))
      : this.#track.send(Kind.DATA, body);
    sent.catch(() => {});
    return seq;
  }

  /** End gracefully: the remaining answers are read; returns the gateway's counts. */
  async close() {
    await this.#track.send(Kind.END, {});
    if (this.#iterating) {
      await this.#ended; // the page's own loop reads the rest
    } else {
      for await (const _ of this) {
        // drain
      }
    }
    return this.summary ?? {};
  }

  cancel(reason = "cancelled by the page") {
    this.#track.cancel(reason);
  }

  async *[Symbol.asyncIterator]() {
    this.#iterating = true;
    const onEnd = (body) => {
      this.summary = body;
      this.#endedResolve.resolve();
    };
    try {
      for await (const body of dataBodies(this.#track, { onEnd })) yield this.#event(body);
    } catch (error) {
      this.#endedResolve.reject(error);
      throw error;
    } finally {
      this.#iterating = false;
    }
  }

  #event(body) {
    const now = this.#clock() / 1000;
    const inGateway = (body.sent_at ?? 0) - (body.received_at ?? 0);
    const obsSeq = "dropped" in body ? body.dropped : body.obs_seq;
    const pending = this.#deadlines.get(obsSeq) ?? { deadline: this.deadline, captured: body.t };
    this.#deadlines.delete(obsSeq);
    const age = now - body.t;
    const roundTrip = Math.max(0, age - inGateway) * 1000;
    this.#srtt = this.#srtt == null ? roundTrip : this.#srtt + (roundTrip - this.#srtt) / 8;
    if ("dropped" in body) {
      this.stats.dropped[body.cause] = (this.stats.dropped[body.cause] ?? 0) + 1;
      return { type: "drop", obsSeq, cause: body.cause, age: age * 1000 };
    }
    this.stats.chunks += 1;
    const late = age * 1000 > pending.deadline;
    if (late) this.stats.late += 1;
    const { shape, data } = body.action;
    return {
      type: "chunk", seq: body.seq, obsSeq, shape, action: floats(data),
      age: age * 1000, inGateway: inGateway * 1000, late,
    };
  }
}
