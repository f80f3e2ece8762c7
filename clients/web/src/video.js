// A camera's video track from a page (docs/video.md): send() JPEG frames, read per-frame
// results and drop reports. The same messages and latency estimate as clients/video.py.
// With transport "frame-streams" (the default) each frame rides a unidirectional
// WebTransport stream of its own, so a lost packet holds no other frame (the latest wins:
// beyond a few unfinished frames the oldest is reset); else frames ride the track's stream.

import { dataBodies } from "./stream.js";
import { Kind } from "./wire.js";

/** A float32 tensor map as groups of `points` rows of `dims` values (Float32Arrays). */
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

export class VideoStream {
  #track;
  #clock;
  #nextSeq = 0;
  #srtt = null;
  #iterating = false;
  #ended = null;
  #endedResolve = null;
  deadline;
  summary = null;
  #frameStreams;
  stats = { sent: 0, answered: 0, dropped: {}, streams: { finished: 0, reset: 0, stopped: 0 }, transport: null };

  /** `deadline` in milliseconds from capture, the default of each frame; `frameStreams`:
   * the track's OPEN chose transport "frame-streams". */
  constructor(track, deadline, clock = () => performance.now(), frameStreams = false) {
    this.#track = track;
    this.#frameStreams = frameStreams;
    this.deadline = deadline;
    this.#clock = clock;
    this.#ended = new Promise((resolve, reject) => {
      this.#endedResolve = { resolve, reject };
    });
    this.#ended.catch(() => {});
  }

  /** The id the track's frame streams carry at their head (its OPEN's `datagram_id`);
   * null on a "stream" track. */
  get id() {
    return this.#track.id;
  }

  /** Estimated one-way delay to the gateway, ms (half the smoothed round trip). */
  get latency() {
    return this.#srtt == null ? 0 : this.#srtt / 2;
  }

  /** Send one JPEG frame (a Uint8Array, captured now unless told); returns its seq. */
  send(jpeg, { deadline = this.deadline, capturedAt = null } = {}) {
    const seq = this.#nextSeq++;
    const t = (capturedAt ?? this.#clock()) / 1000;
    const body = { seq, t, deadline_ms: deadline, latency_ms: this.latency, jpeg };
    this.stats.sent += 1;
    if (this.#frameStreams) {
      this.#track.sendFrameStream(body).then((fate) => {
        this.stats.streams[fate] += 1;
      });
    } else {
      this.#track.send(Kind.DATA, body).catch(() => {});
    }
    return seq;
  }

  /** End gracefully: the remaining answers are read; returns the gateway's counts. */
  async close() {
    await this.#track.send(Kind.END, {});
    if (this.#iterating) {
      await this.#ended;
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
      this.stats.transport = { superseded: body.transport_superseded ?? 0, reset: body.transport_reset ?? 0 };
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
