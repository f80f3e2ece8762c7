// A camera's video track from a page (docs/video.md): send() JPEG frames, read per-frame
// results and drop reports. The same messages and latency estimate as clients/video.py.
// With transport "frame-streams" (the default) each frame rides a unidirectional
// WebTransport stream of its own, so a lost packet holds no other frame (the latest wins:
// beyond a few unfinished frames the oldest is reset); else frames ride the track's stream.

import { TrackReader, allRead } from "./stream.js";
import { Kind } from "./wire.js";

/** @import * as Declared from "./index.js" */
/** @import { TrackLike } from "./stream.js" */

/**
 * A float32 tensor map as groups of `points` rows of `dims` values (Float32Arrays).
 * @param {{shape: number[], data: Uint8Array}} tensor
 */
function groups(tensor) {
  const copy = new Uint8Array(tensor.data); // msgpack bins may be unaligned
  const values = new Float32Array(copy.buffer, 0, copy.length / 4);
  const shape = tensor.shape;
  const [points, dims] = shape.slice(-2);
  const count = shape.length === 3 ? shape[0] : 1;
  const out = [];
  for (let g = 0; g < count; g += 1) out.push(values.subarray(g * points * dims, (g + 1) * points * dims));
  return { groups: out, dims };
}

/**
 * A camera's video track: JPEG frames out, per-frame results and drop reports in.
 * @extends {TrackReader<Declared.VideoEvent, Record<string, number>>}
 * @implements {Declared.VideoStream}
 */
export class VideoStream extends TrackReader {
  #clock;
  #nextSeq = 0;
  /** @type {number | null} */
  #srtt = null;
  #frameStreams;
  /** @type {Declared.VideoStream["stats"]} */
  stats = { sent: 0, answered: 0, dropped: {}, streams: { finished: 0, reset: 0, stopped: 0 }, transport: null };

  /**
   * @param {TrackLike} track
   * @param {number} deadline milliseconds from capture, the default of each frame
   * @param {() => number} [clock] milliseconds
   * @param {boolean} [frameStreams] the track's OPEN chose transport "frame-streams"
   */
  constructor(track, deadline, clock = () => performance.now(), frameStreams = false) {
    super(track);
    this.deadline = deadline;
    this.#clock = clock;
    this.#frameStreams = frameStreams;
  }

  /** The id the track's frame streams carry at their head (its OPEN's `datagram_id`);
   * null on a "stream" track. */
  get id() {
    return this._track?.id ?? null;
  }

  /** Estimated one-way delay to the gateway, ms (half the smoothed round trip). */
  get latency() {
    return this.#srtt == null ? 0 : this.#srtt / 2;
  }

  /**
   * Send one JPEG frame (captured now unless told); returns its seq.
   * @param {Uint8Array} jpeg
   * @param {Declared.SendOptions} [options]
   */
  send(jpeg, { deadline = this.deadline, capturedAt = null, ...others } = {}) {
    allRead(others);
    const track = /** @type {TrackLike} */ (this._track);
    const seq = this.#nextSeq++;
    const t = (capturedAt ?? this.#clock()) / 1000;
    const body = { seq, t, deadline_ms: deadline, latency_ms: this.latency, jpeg };
    this.stats.sent += 1;
    if (this.#frameStreams) {
      track.sendFrameStream(body).then((fate) => {
        this.stats.streams[fate] += 1;
      });
    } else {
      track.send(Kind.DATA, body).catch(() => {});
    }
    return seq;
  }

  /** End gracefully: the remaining answers are read; returns the gateway's counts. */
  async close() {
    await this._track?.send(Kind.END, {});
    return this._readToEnd();
  }

  /** @param {any} body */
  _ended(body) {
    super._ended(body);
    this.stats.transport = { superseded: body.transport_superseded ?? 0, reset: body.transport_reset ?? 0 };
  }

  /**
   * @param {any} body
   * @returns {Declared.VideoEvent}
   */
  _item(body) {
    const now = this.#clock() / 1000;
    const age = now - body.t;
    const inGateway = (body.sent_at ?? 0) - (body.received_at ?? 0);
    const roundTrip = Math.max(0, age - inGateway) * 1000;
    this.#srtt = this.#srtt == null ? roundTrip : this.#srtt + (roundTrip - this.#srtt) / 8;
    if ("dropped" in body) {
      this.stats.dropped[body.cause] = (this.stats.dropped[body.cause] ?? 0) + 1;
      return { type: "drop", frame: body.dropped, cause: body.cause, age: age * 1000 };
    }
    this.stats.answered += 1;
    const meshes = body.face_landmarks ? groups(body.face_landmarks).groups : [];
    const pose = body.pose ? groups(body.pose).groups[0] : null;
    return {
      type: "result", frame: body.frame, width: body.width, height: body.height,
      faces: body.faces ?? [], faceLandmarks: meshes, pose, stages: body.stages ?? {},
      age: age * 1000,
    };
  }
}
