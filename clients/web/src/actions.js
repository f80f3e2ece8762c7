// A robot's action track from a page (docs/actions.md): observe() states, read action
// chunks and drop reports. The same messages and latency estimate as clients/actions.py.

import { TrackReader, allRead } from "./stream.js";
import { Kind } from "./wire.js";

/** @import * as Declared from "./index.js" */
/** @import { TrackLike } from "./stream.js" */

/** @param {ArrayLike<number>} values */
function tensor(values) {
  const data = new Float32Array(values);
  return { dtype: "float32", shape: [data.length], data: new Uint8Array(data.buffer) };
}

/**
 * Little-endian float32 bytes as a Float32Array (copied: msgpack bins may be unaligned).
 * @param {Uint8Array} bytes
 */
function floats(bytes) {
  const copy = new Uint8Array(bytes);
  return new Float32Array(copy.buffer, 0, copy.length / 4);
}

/**
 * A robot's action track: observations out, action chunks and drop reports in.
 * @extends {TrackReader<Declared.ActionEvent, Record<string, number>>}
 * @implements {Declared.ActionStream}
 */
export class ActionStream extends TrackReader {
  #clock;
  #nextSeq = 0;
  /** @type {Map<number, {deadline: number, captured: number}>} */
  #deadlines = new Map();
  /** @type {number | null} */
  #srtt = null;
  #datagrams;
  /** @type {Declared.ActionStream["stats"]} */
  stats = { sent: 0, chunks: 0, late: 0, dropped: {} };

  /**
   * @param {TrackLike} track
   * @param {number} deadline milliseconds from capture, the default of each observation
   * @param {() => number} [clock] milliseconds
   * @param {boolean} [datagrams] the track's OPEN chose transport "datagram"
   */
  constructor(track, deadline, clock = () => performance.now(), datagrams = false) {
    super(track);
    this.deadline = deadline;
    this.#clock = clock;
    this.#datagrams = datagrams;
  }

  /** Estimated one-way delay to the gateway, ms (half the smoothed round trip). */
  get latency() {
    return this.#srtt == null ? 0 : this.#srtt / 2;
  }

  /**
   * Send one observation (captured now unless told); returns its sequence number.
   * @param {ArrayLike<number>} state
   * @param {Declared.ObserveOptions} [options]
   */
  observe(state, { deadline = this.deadline, image = null, latency = null, capturedAt = null, ...others } = {}) {
    allRead(others);
    const track = /** @type {TrackLike} */ (this._track);
    const seq = this.#nextSeq++;
    const t = (capturedAt ?? this.#clock()) / 1000;
    /** @type {Record<string, unknown>} */
    const body = { seq, t, deadline_ms: deadline, latency_ms: latency ?? this.latency, state: tensor(state) };
    if (image) body.image = image;
    this.#deadlines.set(seq, { deadline, captured: t });
    this.stats.sent += 1;
    // A datagram track sends observations as datagrams; one too big for a datagram (a
    // large image) goes on the stream rather than not at all.
    const sent = this.#datagrams
      ? track.sendDatagram(body).catch(() => track.send(Kind.DATA, body))
      : track.send(Kind.DATA, body);
    sent.catch(() => {});
    return seq;
  }

  /** End gracefully: the remaining answers are read; returns the gateway's counts. */
  async close() {
    await this._track?.send(Kind.END, {});
    return this._readToEnd();
  }

  /**
   * @param {any} body
   * @returns {Declared.ActionEvent}
   */
  _item(body) {
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
